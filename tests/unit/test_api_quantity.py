"""Resource quantities: the grammar the API server accepts (refused at admission otherwise, naming the
field) and comparison by value, so the API server's canonical form ("0.5" stored as "500m") is no drift."""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.quantity import QUANTITY_PATTERN, is_quantity, quantity_value, same_quantity
from disagg.k8s.apply import first_difference, matches

ACCEPTED = ["8", 8, "0.5", ".5", "1.", "500m", "64Gi", "256G", "1e3", "1E", "2Ei", "100n", "+1"]
REFUSED = ["256GB", "4 cores", "-1Gi", -1, "", "1gi", "Gi", "1.2.3", "1e999", "0x10", True]


@pytest.mark.parametrize("value", ACCEPTED)
def test_kubernetes_quantities_are_accepted(value: int | str) -> None:
    assert is_quantity(value)
    if isinstance(value, str):  # the CRD's pattern agrees with the model's check
        assert re.match(QUANTITY_PATTERN, value)


@pytest.mark.parametrize("value", REFUSED)
def test_anything_else_is_refused(value: object) -> None:
    assert not is_quantity(value)
    if isinstance(value, str):
        assert not re.match(QUANTITY_PATTERN, value)


@pytest.mark.parametrize(
    ("value", "exact"),
    [("0.5", "0.5"), ("500m", "0.5"), ("1Gi", "1073741824"), ("1.5k", "1500"), ("1e3", "1000"), (8, "8")],
)
def test_value_of_a_quantity(value: int | str, exact: str) -> None:
    assert quantity_value(value) == Decimal(exact)


def _deployment(**requests: Any) -> dict[str, Any]:
    with open("examples/vllm-nixl.yaml") as handle:
        obj: dict[str, Any] = yaml.safe_load(handle)
    obj["spec"]["prefill"]["resources"] = {"requests": requests}
    return obj


def test_the_model_refuses_a_non_quantity_naming_the_field() -> None:
    with pytest.raises(ValidationError) as raised:
        DisaggregatedDeployment.model_validate(_deployment(memory="256GB"))
    (error,) = raised.value.errors()
    assert error["loc"][:5] == ("spec", "prefill", "resources", "requests", "memory")
    assert "256GB" in error["msg"]
    assert DisaggregatedDeployment.model_validate(_deployment(memory="256G", cpu="0.5"))


def test_a_quantity_the_server_normalised_is_no_drift() -> None:
    desired = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"cpu": 2}}}
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "0.5Gi"}}],
        }
    }
    live = copy.deepcopy(desired)
    live["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "2"},
    }
    live["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = "512Mi"
    assert matches(desired, live)
    assert first_difference(desired, live) is None
    # a changed amount is drift
    changed = copy.deepcopy(live)
    changed["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "600m"
    assert not matches(desired, changed)
    assert first_difference(desired, changed) == ".spec.containers[0].resources.requests.cpu: '0.5' vs '600m'"


def test_only_quantity_fields_compare_by_value() -> None:
    # an env value is text: "0.5" rewritten to "500m" by hand is drift
    desired = {"env": [{"name": "RATIO", "value": "0.5"}]}
    assert not matches(desired, {"env": [{"name": "RATIO", "value": "500m"}]})
    assert not same_quantity("0.5", "half")
