"""spec.model.cache: the API, the claim and download Job builders, the engine pods' volume and env, the
gate that holds the pools until the download succeeded, the status it writes, and the start-up delay the
twin takes from it (pure, no cluster)."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from disagg.api.crd import crd_for, deployment_crd_spec
from disagg.api.deployment import (
    CACHE_NEEDS_HUGGING_FACE,
    READ_ONLY_CREATE_NEEDS_PREFILLED,
    DisaggregatedDeployment,
)
from disagg.controller.modelcache import gated_replicas, model_cache_state
from disagg.controller.reconcile import FULL, Applied, Reconciler, render
from disagg.controller.settings import ControllerSettings
from disagg.controller.status import build_status, role_state
from disagg.k8s.apply import apply_waves, with_owner
from disagg.perf.startup import StartupAssumptions, spec_startup_delay_s, startup_delay_s, weights_cached
from disagg.policy.types import Observation
from disagg.render import (
    build_engine_pod_template,
    build_model_cache_pvc,
    build_model_download_job,
    render_children,
)
from disagg.render.engines import HF_CACHE_DIR, HF_HUB_CACHE_DIR
from disagg.twin.sim import SimDeployment, simulate
from disagg.twin.traffic import LengthDist, Request, poisson

REPO = Path(__file__).resolve().parents[2]
MODEL_ID = "meta-llama/Llama-3.1-70B-Instruct"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def crd_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the generated DisaggregatedDeployment CRD."""
    schema: dict[str, Any] = crd_for(deployment_crd_spec())["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]
    return schema


def doc(cache: dict[str, Any] | None = None, **source: Any) -> dict[str, Any]:
    model: dict[str, Any] = {
        "name": MODEL_ID,
        "source": {
            "huggingFace": {"id": MODEL_ID, "tokenSecretRef": {"name": "hf", "key": "token"}, **source}
        },
    }
    if cache is not None:
        model["cache"] = cache
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "llama", "namespace": "team", "uid": "u-1"},
        "spec": {
            "model": model,
            "engine": {"type": "vllm"},
            "kvTransfer": {"connector": "nixl"},
            "prefill": {"replicas": 2, "tensorParallelSize": 4},
            "decode": {"replicas": 1, "tensorParallelSize": 4},
        },
    }


CREATE = {"claimName": "weights", "create": {"size": "200Gi", "storageClassName": "fast-rwx"}}


def dd(cache: dict[str, Any] | None = None, **source: Any) -> DisaggregatedDeployment:
    return DisaggregatedDeployment.model_validate(doc(cache, **source))


# --------------------------------------------------------------------------------------------- the API


def test_cache_needs_a_hugging_face_source_with_the_same_message_as_the_cel_rule() -> None:
    bad = doc(CREATE)
    bad["spec"]["model"]["source"] = {"pvc": {"claimName": "weights"}}
    with pytest.raises(ValidationError, match=re.escape(CACHE_NEEDS_HUGGING_FACE)):
        DisaggregatedDeployment.model_validate(bad)
    schema = crd_schema()["properties"]["spec"]["properties"]["model"]
    assert {
        "rule": "!has(self.cache) || has(self.source.huggingFace)",
        "message": CACHE_NEEDS_HUGGING_FACE,
        "fieldPath": ".cache",
    } in schema["x-kubernetes-validations"]


def test_a_read_only_claim_the_operator_creates_must_be_prefilled() -> None:
    read_only = {"claimName": "weights", "create": {"size": "200Gi", "accessMode": "ReadOnlyMany"}}
    with pytest.raises(ValidationError, match=re.escape(READ_ONLY_CREATE_NEEDS_PREFILLED)):
        dd(read_only)
    assert dd({**read_only, "prefilled": True}).spec.model.cache is not None
    cache = crd_schema()["properties"]["spec"]["properties"]["model"]["properties"]["cache"]
    assert [r["message"] for r in cache["x-kubernetes-validations"]] == [READ_ONLY_CREATE_NEEDS_PREFILLED]
    with pytest.raises(ValidationError, match="accessMode"):
        dd({"claimName": "weights", "create": {"size": "1Gi", "accessMode": "ReadWriteOnce"}})
    with pytest.raises(ValidationError, match=r"claimName|claim_name"):
        dd({"claimName": "Not_A_Name"})


def test_every_cache_field_is_described_for_kubectl_explain() -> None:
    model = crd_schema()["properties"]["spec"]["properties"]["model"]["properties"]
    cache = model["cache"]
    assert cache["description"]
    for name in ("claimName", "create", "prefilled"):
        assert cache["properties"][name]["description"], name
    for name in ("size", "storageClassName", "accessMode"):
        assert cache["properties"]["create"]["properties"][name]["description"], name
    assert cache["properties"]["create"]["properties"]["accessMode"]["enum"] == [
        "ReadWriteMany",
        "ReadOnlyMany",
    ]


# ------------------------------------------------------------------------------------------- builders


def test_the_claim_is_built_only_when_the_operator_creates_it() -> None:
    pvc = build_model_cache_pvc(dd(CREATE))
    assert pvc is not None
    assert (pvc["apiVersion"], pvc["kind"], pvc["metadata"]["name"]) == (
        "v1",
        "PersistentVolumeClaim",
        "weights",
    )
    assert pvc["metadata"]["namespace"] == "team"
    assert pvc["metadata"]["labels"]["disagg.dev/deployment"] == "llama"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "200Gi"}},
        "volumeMode": "Filesystem",
        "storageClassName": "fast-rwx",
    }
    assert build_model_cache_pvc(dd({"claimName": "weights"})) is None  # the user's claim
    assert build_model_cache_pvc(dd()) is None


def test_the_download_job_fills_the_hugging_face_cache_on_the_claim() -> None:
    job = build_model_download_job(dd(CREATE, revision="v1.2"))
    assert job is not None and (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    name = job["metadata"]["name"]
    assert name.startswith("llama-download-") and len(name) <= 63
    spec = job["spec"]
    assert spec["backoffLimit"] >= 1 and "ttlSecondsAfterFinished" not in spec
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["volumes"] == [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": "weights"}}]
    (container,) = pod["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.33.0"  # the engine image ships the hf CLI
    assert container["command"] == [
        "hf",
        "download",
        MODEL_ID,
        "--revision",
        "v1.2",
        "--cache-dir",
        HF_HUB_CACHE_DIR,
    ]
    assert container["volumeMounts"] == [{"name": "hf-cache", "mountPath": HF_HUB_CACHE_DIR}]  # read-write
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HUB_CACHE"]["value"] == HF_HUB_CACHE_DIR
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert "HF_HUB_OFFLINE" not in env
    # one Job per (model id, revision): a new revision is a new Job
    other = build_model_download_job(dd(CREATE, revision="v1.3"))
    assert other is not None and other["metadata"]["name"] != name
    longest = doc(CREATE)
    longest["metadata"]["name"] = "a" * 46
    job = build_model_download_job(DisaggregatedDeployment.model_validate(longest))
    assert job is not None and len(job["metadata"]["name"]) == 63


def test_no_download_job_without_a_cache_or_when_prefilled() -> None:
    assert build_model_download_job(dd()) is None
    assert build_model_download_job(dd({"claimName": "weights", "prefilled": True})) is None


def test_engine_pods_mount_the_claim_read_only_offline_and_without_the_token() -> None:
    for role in ("prefill", "decode"):
        pod = build_engine_pod_template(dd(CREATE), role)["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["hf-cache"] == {
            "name": "hf-cache",
            "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
        }
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["hf-cache"] == {"name": "hf-cache", "mountPath": HF_HUB_CACHE_DIR, "readOnly": True}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HF_HUB_CACHE"] == HF_HUB_CACHE_DIR and env["HF_HUB_OFFLINE"] == "1"
        assert "HF_TOKEN" not in env


def test_without_a_cache_the_pods_keep_the_emptydir_download_cache() -> None:
    pod = build_engine_pod_template(dd(), "prefill")["spec"]
    assert {"name": "hf-cache", "emptyDir": {}} in pod["volumes"]
    (container,) = pod["containers"]
    assert {"name": "hf-cache", "mountPath": HF_CACHE_DIR} in container["volumeMounts"]
    env = {e["name"] for e in container["env"]}
    assert "HF_TOKEN" in env and not env & {"HF_HUB_CACHE", "HF_HUB_OFFLINE"}
    kinds = [c["kind"] for c in render_children(dd())]
    assert "Job" not in kinds and "PersistentVolumeClaim" not in kinds


def test_a_pod_template_volume_of_the_same_name_replaces_the_claim() -> None:
    spec = doc(CREATE)
    spec["spec"]["prefill"]["podTemplate"] = {
        "spec": {
            "volumes": [
                {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "mine", "readOnly": True}}
            ]
        }
    }
    pod = build_engine_pod_template(DisaggregatedDeployment.model_validate(spec), "prefill")["spec"]
    caches = [v for v in pod["volumes"] if v["name"] == "hf-cache"]
    assert caches == [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": "mine", "readOnly": True}}]


def test_render_children_adds_the_claim_first_and_the_job_with_the_deployments() -> None:
    children = render_children(dd(CREATE))
    kinds = [c["kind"] for c in children]
    assert kinds.index("PersistentVolumeClaim") < kinds.index("Service") < kinds.index("Job")
    waves = [[c["kind"] for c in wave] for wave in apply_waves(children)]
    assert "PersistentVolumeClaim" in waves[0] and "Job" in waves[1] and "Deployment" in waves[1]
    prefilled = [c["kind"] for c in render_children(dd({"claimName": "weights", "prefilled": True}))]
    assert "Job" not in prefilled and "PersistentVolumeClaim" not in prefilled


# ---------------------------------------------------------------------------------------------- the gate


def job(**status: Any) -> dict[str, Any]:
    built = build_model_download_job(dd(CREATE))
    assert built is not None
    return {**built, "status": status}


def test_no_cache_or_a_prefilled_claim_lets_the_pools_run() -> None:
    assert model_cache_state(dd(), None).pools_run
    assert model_cache_state(dd(), None).condition is None
    prefilled = model_cache_state(dd({"claimName": "weights", "prefilled": True}), None)
    assert prefilled.pools_run and prefilled.condition is not None
    assert (prefilled.condition.status, prefilled.condition.reason) == (True, "Prefilled")


def test_pools_wait_until_the_download_job_succeeded() -> None:
    spec = dd(CREATE)
    for live in (None, job(), job(active=1), job(active=1, failed=2)):
        state = model_cache_state(spec, live)
        assert not state.pools_run and state.problem is None
        assert state.condition is not None and (state.condition.status, state.condition.reason) == (
            False,
            "Downloading",
        )
        assert gated_replicas({"prefill": 2, "decode": 1}, state) == {"prefill": 0, "decode": 0}
    done = model_cache_state(spec, job(succeeded=1, conditions=[{"type": "Complete", "status": "True"}]))
    assert done.pools_run and done.condition is not None and done.condition.reason == "Downloaded"
    assert done.job_name is not None and done.job_name in done.condition.message
    assert gated_replicas({"prefill": 2, "decode": 1}, done) == {"prefill": 2, "decode": 1}


def test_a_failed_download_degrades_naming_the_job_and_keeps_the_pools_at_zero() -> None:
    failed = job(
        failed=5,
        conditions=[
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "5 pods"}
        ],
    )
    state = model_cache_state(dd(CREATE), failed)
    assert not state.pools_run
    assert state.problem is not None and state.problem.reason == "ModelDownloadFailed"
    assert not state.problem.transient  # no retry loop: Degraded until the spec or the Job changes
    assert str(failed["metadata"]["name"]) in state.problem.message
    assert "BackoffLimitExceeded" in state.problem.message
    assert state.condition is not None and state.condition.reason == "DownloadFailed"


def test_a_download_that_succeeded_once_is_remembered_in_the_condition() -> None:
    spec = dd(CREATE)
    done = model_cache_state(spec, job(conditions=[{"type": "Complete", "status": "True"}]))
    assert done.condition is not None
    previous = {
        "type": "ModelCached",
        "status": "True",
        "reason": "Downloaded",
        "message": done.condition.message,
    }
    assert model_cache_state(spec, None, previous).pools_run  # the finished Job was deleted
    assert model_cache_state(spec, job(active=1), previous).pools_run  # and runs again
    # ... but not for another revision
    assert not model_cache_state(dd(CREATE, revision="v2"), None, previous).pools_run


def test_status_is_not_ready_while_the_model_is_not_cached() -> None:
    def deployment(replicas: int) -> dict[str, Any]:
        return {
            "metadata": {"generation": 1},
            "spec": {"replicas": replicas},
            "status": {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": replicas,
                "updatedReplicas": replicas,
            },
        }

    roles = {
        "prefill": role_state(deployment(0)),
        "decode": role_state(deployment(0)),
        "router": role_state(deployment(1)),
    }
    waiting = build_status({}, 1, roles, None, None, T0, (False, "Downloading", "Job j is downloading"))
    conditions = {c["type"]: c for c in waiting["conditions"]}
    assert (
        conditions["ModelCached"]["status"] == "False"
        and conditions["ModelCached"]["reason"] == "Downloading"
    )
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "ModelNotCached"
    assert conditions["Progressing"]["status"] == "True" and conditions["Degraded"]["status"] == "False"
    cached = build_status(waiting, 1, roles, None, None, T0, (True, "Downloaded", "Job j downloaded"))
    conditions = {c["type"]: c for c in cached["conditions"]}
    assert conditions["ModelCached"]["status"] == "True" and conditions["Ready"]["status"] == "True"
    removed = build_status(cached, 1, roles, None, None, T0)
    assert "ModelCached" not in {c["type"] for c in removed["conditions"]}


# ------------------------------------------------------------------------------------ start-up delay


def test_startup_delay_is_shorter_from_the_cache_and_follows_the_assumptions() -> None:
    weights = 141.2e9  # Llama-3.1-70B in bf16
    cached, downloading = startup_delay_s(weights, True), startup_delay_s(weights, False)
    assert 60.0 < cached < downloading
    fast_hub = StartupAssumptions(hub_download_gbytes_per_s=5.0)
    assert startup_delay_s(weights, False, fast_hub) < downloading
    assert startup_delay_s(0.0, True, StartupAssumptions(engine_init_s=7.0)) == 7.0
    with pytest.raises(ValueError, match="hub_download_gbytes_per_s"):
        StartupAssumptions(hub_download_gbytes_per_s=0)
    assert weights_cached(doc(CREATE)["spec"]) and not weights_cached(doc()["spec"])
    pvc = doc()["spec"]
    pvc["model"]["source"] = {"pvc": {"claimName": "w"}}
    assert weights_cached(pvc)
    assert spec_startup_delay_s(doc(CREATE)["spec"], "bf16") == pytest.approx(
        startup_delay_s(70.6e9 * 2, True)
    )


def test_the_example_deployment_starts_replicas_from_its_cache() -> None:
    example = yaml.safe_load((REPO / "examples" / "vllm-nixl.yaml").read_text())
    uncached = copy.deepcopy(example)
    del uncached["spec"]["model"]["cache"]
    assert (
        SimDeployment.from_dict(example).startup_delay_s < SimDeployment.from_dict(uncached).startup_delay_s
    )


class ScaleUpAt:
    """Asks for three prefill replicas from ``at`` on (a step in load the policy answers)."""

    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self, obs: Observation) -> dict[str, int] | None:
        return {"prefill": 3, "decode": 1} if obs.time >= self.at else None


def test_a_cached_deployment_serves_a_step_in_load_sooner_in_the_simulator() -> None:
    shapes = (LengthDist(3000, 0.5, hi=8000), LengthDist(100, 0.5, hi=400))
    low = poisson(0.5, 60, *shapes, seed=1)
    high = [
        Request(r.arrival_s + 60, r.prompt_tokens, r.output_tokens)
        for r in poisson(4.0, 540, *shapes, seed=2)
    ]
    results = {}
    for cached in (True, False):
        spec = doc(CREATE if cached else None)
        spec["spec"]["prefill"]["replicas"] = 1
        # the scale-up lies within the autoscaling bounds (without them the pools hold the spec's replicas)
        spec["spec"]["autoscaling"] = {"prefill": {"minReplicas": 1, "maxReplicas": 4}}
        deployment = SimDeployment.from_dict(spec)
        result = simulate(deployment, low + high, controller=ScaleUpAt(60.0), interval_s=30.0)
        ready_at = min(t for t, d in result.replicas if d["prefill"][1] == 3)
        misses = int(np.sum(~(result.ttft <= 2.0)))  # TTFT over 2 s, or no first token
        results[cached] = (deployment.startup_delay_s, ready_at, misses)
    (cached_delay, cached_ready, cached_misses) = results[True]
    (download_delay, download_ready, download_misses) = results[False]
    assert cached_delay < download_delay
    assert cached_ready == pytest.approx(60.0 + cached_delay)  # scaled at the 60 s evaluation
    assert download_ready - cached_ready == pytest.approx(download_delay - cached_delay)
    assert cached_misses < download_misses


# ----------------------------------------------------------------------------------------- reconciler


def test_every_event_of_the_download_job_is_a_full_reconcile() -> None:
    reconciler = Reconciler(api=None, settings=ControllerSettings())  # type: ignore[arg-type]
    key = ("team", "llama")
    owner = doc(CREATE)
    live = with_owner(job(active=1), owner)
    manifests = {("Job", live["metadata"]["name"]): with_owner(job(), owner)}
    reconciler._remember(
        key, Applied(1, {"prefill": 0, "decode": 0}, manifests, None, {"prefill": 2, "decode": 1})
    )
    assert reconciler.child_event_level(key, live, deleted=False) == FULL  # its status gates the pools


def test_held_pools_are_not_taken_for_a_replicas_change() -> None:
    reconciler = Reconciler(api=None, settings=ControllerSettings())  # type: ignore[arg-type]
    owner = doc(CREATE)
    key = ("team", "llama")
    held = Applied(1, {"prefill": 0, "decode": 0}, {}, None, {"prefill": 2, "decode": 1})
    reconciler._remember(key, held)
    assert not reconciler.needs_reapply(owner)  # 0 applied while downloading, 2/1 wanted: nothing new
    owner["spec"]["prefill"]["replicas"] = 3
    assert reconciler.needs_reapply(owner)


def test_render_holds_the_pools_at_zero_until_the_model_is_cached() -> None:
    spec = dd(CREATE)
    children, replicas, problem = render(spec, model_cache_state(spec, job(active=1)))
    assert problem is None and replicas == {"prefill": 0, "decode": 0}
    pools = {c["metadata"]["name"]: c["spec"]["replicas"] for c in children if c["kind"] == "Deployment"}
    assert pools == {"llama-prefill": 0, "llama-decode": 0, "llama-router": 1}
    done = model_cache_state(spec, job(conditions=[{"type": "Complete", "status": "True"}]))
    _, replicas, _ = render(spec, done)
    assert replicas == {"prefill": 2, "decode": 1}


@pytest.mark.parametrize("example", ["deepseek-r1-wideep-vllm.yaml", "deepseek-r1-wideep-sglang.yaml"])
def test_a_wide_ep_replica_starts_in_the_time_its_whole_checkpoint_takes(example: str) -> None:
    # DeepSeek-R1 is published in FP8: 671B parameters, ~671 GB that every node of a group fetches (vLLM
    # and SGLang load from a local path on each node); the policy plans over that, not over the default
    from disagg.api.deployment import DisaggregatedDeployment
    from disagg.perf.startup import checkpoint_bytes
    from disagg.policy.bounds import bounds_for

    assert checkpoint_bytes("deepseek-ai/DeepSeek-R1", "bf16") == pytest.approx(671e9, rel=0.01)
    assert checkpoint_bytes("deepseek-ai/DeepSeek-R1", "fp8") == checkpoint_bytes("deepseek-r1", "bf16")
    doc = next(
        d
        for d in yaml.safe_load_all((REPO / "examples" / example).read_text())
        if d and d["kind"] == "DisaggregatedDeployment"
    )
    dd = DisaggregatedDeployment.model_validate(doc)
    cached = weights_cached(dd.spec.to_api())
    assert bounds_for(dd).decode.startup_seconds == pytest.approx(startup_delay_s(671e9, cached), rel=0.01)
