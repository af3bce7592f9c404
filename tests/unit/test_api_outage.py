"""The API server unreachable (refused, reset, timed out): the reconciler treats it as temporary.

urllib3 raises ``MaxRetryError`` (wrapping ``NewConnectionError``) when the API server is down, none of
which is an OSError or an ApiException; it used to escape the reconciler, so kopf logged a traceback per
attempt and retried after its 60 s default backoff instead of the configured short retry. These tests talk
to a real closed port on loopback (no mocks): the request layer raises ``ApiUnreachable`` (an OSError) in
one line, the reconciler a TransientError, the kopf handler a ``kopf.TemporaryError`` with
``retry_delay_s``."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from kubernetes import client as k8s_client

from disagg.controller.gate import ReconcileGate
from disagg.controller.handlers import ReconcileContext, register
from disagg.controller.reconcile import Reconciler, TransientError
from disagg.controller.settings import ControllerSettings
from disagg.k8s.client import DISAGG_DEPLOYMENT, ApiUnreachable, KubeApi

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def unreachable_api() -> Iterator[KubeApi]:
    """A KubeApi pointed at a loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    configuration = k8s_client.Configuration(host=f"https://127.0.0.1:{port}")
    configuration.retries = 0  # refused at once; urllib3 still wraps the refusal in MaxRetryError
    api_client = k8s_client.ApiClient(configuration)
    try:
        yield KubeApi(api_client, request_timeout_s=5.0)
    finally:
        api_client.close()


def _deployment() -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "vllm-nixl.yaml").read_text())
    obj["metadata"].update({"namespace": "prod", "uid": "0f0e", "generation": 1, "resourceVersion": "7"})
    return obj


def test_a_refused_connection_is_an_os_error_in_one_line(unreachable_api: KubeApi) -> None:
    with pytest.raises(ApiUnreachable) as raised:
        unreachable_api.get(DISAGG_DEPLOYMENT, "prod", "llama")
    assert isinstance(raised.value, OSError)
    message = str(raised.value)
    assert "\n" not in message and "API server unreachable" in message
    assert DISAGG_DEPLOYMENT.path("prod", "llama") in message
    assert type(raised.value.__cause__).__name__ == "MaxRetryError"  # what urllib3 raised


def test_the_reconciler_raises_a_transient_error_at_every_step(unreachable_api: KubeApi) -> None:
    reconciler = Reconciler(unreachable_api, ControllerSettings())
    with pytest.raises(TransientError, match="API server unreachable"):
        reconciler.reconcile("prod", "llama")  # the first read
    # read before the outage, then listing/applying children and writing the status fail
    with pytest.raises(TransientError, match="API server unreachable"):
        reconciler.reconcile_object(_deployment())


def test_the_kopf_handler_retries_after_the_configured_delay(unreachable_api: KubeApi) -> None:
    settings = ControllerSettings(retry_delay_s=3.0)
    context = ReconcileContext(Reconciler(unreachable_api, settings), ReconcileGate(), settings)
    registry = kopf.OperatorRegistry()
    register(registry, context)
    handlers = {h.id: h for h in registry._changing.get_all_handlers()}
    with pytest.raises(kopf.TemporaryError) as raised:
        handlers["reconcile"].fn(
            namespace="prod", name="llama", reason=kopf.Reason.CREATE, body={"metadata": {"generation": 1}}
        )
    assert raised.value.delay == 3.0
    assert "API server unreachable" in str(raised.value)


def test_the_autoscaling_timer_retries_at_its_tick(unreachable_api: KubeApi) -> None:
    from disagg.controller.autoscaler import Autoscaler
    from disagg.controller.autoscaler import register as register_autoscaling
    from disagg.controller.settings import AutoscalingSettings

    settings = AutoscalingSettings(tick_s=1.5)
    registry = kopf.OperatorRegistry()
    register_autoscaling(registry, Autoscaler(unreachable_api, settings, None, None))  # type: ignore[arg-type]
    (timer,) = registry._spawning.get_all_handlers()
    body = _deployment()
    body["spec"]["autoscaling"] = {"enabled": True, "policyRef": {"name": "chat"}}
    with pytest.raises(kopf.TemporaryError) as raised:
        timer.fn(body=body, memo={}, logger=None)
    assert raised.value.delay == 1.5 and "API server unreachable" in str(raised.value)
