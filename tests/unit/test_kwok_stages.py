"""The kwok stages of the local cluster: a pod is Ready at once, unless it asks to wait for the twin."""

from __future__ import annotations

from typing import Any

import yaml

from disagg.cluster.kwok_stages import (
    READY_WHEN_SERVED,
    TERMINATE_AFTER_GRACE,
    TWIN_ENDPOINT,
    kwok_config_documents,
    pod_stages,
)
from disagg.twin.live.follower import ENDPOINT_ANNOTATION


def _by_name() -> dict[str, dict[str, Any]]:
    return {stage["metadata"]["name"]: stage["spec"] for stage in pod_stages()}


def _keys(spec: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {
        e["key"]: (e["operator"], tuple(e.get("values") or ())) for e in spec["selector"]["matchExpressions"]
    }


def _ready_in(template: str) -> str:
    """The Ready condition's status in a rendered-free template (the Go template parts are plain text)."""
    lines = template.splitlines()
    index = lines.index("- type: Ready")
    return lines[index + 1].strip()


def test_a_pod_that_asks_is_held_unready_until_the_twin_serves_it() -> None:
    stages = _by_name()
    gate = f'.metadata.annotations["{READY_WHEN_SERVED}"]'
    served = f'.metadata.annotations["{TWIN_ENDPOINT}"]'
    assert TWIN_ENDPOINT == ENDPOINT_ANNOTATION  # what the live twin sets once its engine serves
    running, held = stages["disagg-pod-running"], stages["disagg-pod-running-until-served"]
    assert _keys(running)[gate] == ("DoesNotExist", ())
    assert _keys(held)[gate] == ("Exists", ())
    assert _ready_in(running["next"]["statusTemplate"]) == 'status: "True"'
    assert _ready_in(held["next"]["statusTemplate"]) == 'status: "False"'
    assert "ready: false" in held["next"]["statusTemplate"]
    assert "podIP:" in held["next"]["statusTemplate"]  # the twin serves it on its pod IP meanwhile
    ready = stages["disagg-pod-served"]
    keys = _keys(ready)
    assert keys[gate] == ("Exists", ()) and keys[served] == ("Exists", ())
    assert keys[".status.phase"] == ("In", ("Running",))
    assert keys[".metadata.deletionTimestamp"] == ("DoesNotExist", ())
    assert _ready_in(ready["next"]["statusTemplate"]) == 'status: "True"'
    assert "podIP" not in ready["next"]["statusTemplate"]  # the IP it got stays
    # every stage is one YAML document kwok can read
    documents = yaml.safe_load_all(yaml.safe_dump_all(kwok_config_documents()))
    assert {d["kind"] for d in documents} == {"Stage"}


def test_a_pod_that_asks_is_removed_only_when_its_grace_period_ends() -> None:
    stages = _by_name()
    opt_in = f'.metadata.annotations["{TERMINATE_AFTER_GRACE}"]'
    at_once, after_grace = stages["disagg-pod-delete"], stages["disagg-pod-delete-after-grace"]
    assert _keys(at_once)[opt_in] == ("DoesNotExist", ()) and "delay" not in at_once
    assert _keys(after_grace)[opt_in] == ("Exists", ())
    assert _keys(after_grace)[".metadata.deletionTimestamp"] == ("Exists", ())
    assert after_grace["delay"]["durationFrom"] == {"expressionFrom": ".metadata.deletionTimestamp"}
    assert after_grace["next"] == {"delete": True}
