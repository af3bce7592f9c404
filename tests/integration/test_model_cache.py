"""spec.model.cache on the local control plane, with the operator running as a real process.

The operator creates the cache claim and the download Job, and holds both pools at 0 replicas (router and
Services as usual) with ``ModelCached`` False until the Job has succeeded; then the pools get their
replicas and ``ModelCached`` turns True. A Job that fails makes the object Degraded with a Warning Event
naming it, and the operator keeps running.

kwok does not run containers, and its stages here (disagg.cluster.kwok_stages) only take a pod from
Pending to Running: nothing ever completes a pod. So the test plays the kubelet: it writes the download
pod's status subresource as ``Succeeded`` (container terminated with exit code 0), and the real Job
controller of kube-controller-manager counts it and marks the Job Complete, exactly as on a cluster.
For the failure, it shortens the Job's ``activeDeadlineSeconds`` (a mutable field) to 1 s and the Job
controller fails the Job with reason DeadlineExceeded. The claim gets a PersistentVolume bound to it
ahead (there is no provisioner), so the scheduler can place the download pod.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from kubernetes.client.exceptions import ApiException

from disagg.api.deployment import CACHE_NEEDS_HUGGING_FACE, READ_ONLY_CREATE_NEEDS_PREFILLED
from disagg.cluster.wait import wait_for
from disagg.k8s.apply import DEPLOYMENT_LABEL
from disagg.k8s.client import (
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    EVENT,
    JOB,
    MERGE_PATCH,
    PVC,
    JsonDict,
    KubeApi,
)

if TYPE_CHECKING:
    from conftest import ModelCachePlayer, OperatorProcess  # tests/integration/conftest.py

CLAIM = "weights"  # the claim of cached_deployment
TIMEOUT_S = 120.0


def poll(check: Any, timeout_s: float = TIMEOUT_S, what: str = "") -> Any:
    return wait_for(check, timeout_s, what=what)


def cached_deployment(name: str, namespace: str) -> JsonDict:
    """A small vLLM + NIXL deployment whose weights are cached on a claim the operator creates."""
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {
                "name": "Qwen/Qwen3-0.6B",
                "source": {"huggingFace": {"id": "Qwen/Qwen3-0.6B", "revision": "main"}},
                "cache": {"claimName": CLAIM, "create": {"size": "10Gi", "accessMode": "ReadWriteMany"}},
            },
            "engine": {"type": "vllm"},
            "kvTransfer": {"connector": "nixl"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 2},
        },
    }


def condition(kube: KubeApi, namespace: str, name: str, type_: str) -> JsonDict:
    obj = kube.get(DISAGG_DEPLOYMENT, namespace, name) or {}
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_]
    return found[0] if found else {}


def replicas(kube: KubeApi, namespace: str, name: str) -> int | None:
    obj = kube.get(DEPLOYMENT, namespace, name)
    return None if obj is None else int(obj["spec"]["replicas"])


def owned_job(kube: KubeApi, namespace: str, name: str) -> JsonDict | None:
    jobs = kube.list(JOB, namespace, label_selector=f"{DEPLOYMENT_LABEL}={name}")
    return jobs[0] if len(jobs) == 1 else None


def wait_held_at_zero(kube: KubeApi, namespace: str, name: str) -> JsonDict:
    """The Job and claim exist and are owned, both pools are at 0, the router runs, ModelCached False."""
    owner = kube.get(DISAGG_DEPLOYMENT, namespace, name)
    assert owner is not None
    job: JsonDict = poll(lambda: owned_job(kube, namespace, name), what=f"the download Job of {name}")
    claim = poll(lambda: kube.get(PVC, namespace, CLAIM), what=f"claim {CLAIM}")
    for child in (job, claim):
        refs = child["metadata"].get("ownerReferences") or []
        assert [r["uid"] for r in refs if r.get("controller")] == [owner["metadata"]["uid"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    poll(
        lambda: (
            replicas(kube, namespace, f"{name}-prefill") == 0
            and replicas(kube, namespace, f"{name}-decode") == 0
        ),
        what="both pools applied with 0 replicas",
    )
    assert replicas(kube, namespace, f"{name}-router") == 1
    cached = poll(
        lambda: (
            condition(kube, namespace, name, "ModelCached").get("status") == "False"
            and condition(kube, namespace, name, "ModelCached")
        ),
        what="ModelCached False",
    )
    assert cached["reason"] == "Downloading" and job["metadata"]["name"] in cached["message"]
    assert condition(kube, namespace, name, "Ready")["status"] == "False"
    # the engine pods would mount the claim read-only
    pool = kube.get(DEPLOYMENT, namespace, f"{name}-decode")
    assert pool is not None
    volumes = {v["name"]: v for v in pool["spec"]["template"]["spec"]["volumes"]}
    assert volumes["hf-cache"]["persistentVolumeClaim"] == {"claimName": CLAIM, "readOnly": True}
    return job


def test_pools_wait_for_the_download_job_then_get_their_replicas(
    model_cache: ModelCachePlayer, kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    model_cache.provide_volume(cached_deployment("any", namespace), namespace)
    kube.apply(cached_deployment("cached", namespace), field_manager="disagg-tests", kind=DISAGG_DEPLOYMENT)
    job = wait_held_at_zero(kube, namespace, "cached")
    assert job["spec"]["backoffLimit"] >= 1 and "ttlSecondsAfterFinished" not in job["spec"]

    assert model_cache.complete_download(namespace, "cached") == job["metadata"]["name"]

    def complete() -> bool:
        live = kube.get(JOB, namespace, job["metadata"]["name"]) or {}
        conditions = (live.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Complete" and c.get("status") == "True" for c in conditions)

    poll(complete, what="the Job controller to mark the download Job Complete")
    poll(
        lambda: (
            replicas(kube, namespace, "cached-prefill") == 1
            and replicas(kube, namespace, "cached-decode") == 2
        ),
        what="the pools scaled to their replicas once the Job succeeded",
    )
    cached = poll(
        lambda: (
            condition(kube, namespace, "cached", "ModelCached").get("status") == "True"
            and condition(kube, namespace, "cached", "ModelCached")
        ),
        what="ModelCached True",
    )
    assert cached["reason"] == "Downloaded"
    poll(lambda: condition(kube, namespace, "cached", "Ready").get("status") == "True", what="cached Ready")
    assert kube.get(JOB, namespace, job["metadata"]["name"]) is not None  # kept, finished, for its outcome
    assert operator_process.alive()


def test_a_second_deployment_creating_the_same_claim_is_degraded_and_the_first_keeps_it(
    model_cache: ModelCachePlayer, kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    """Two deployments asking the operator to create one claim: the first owns it; the second is Degraded
    (ModelCacheClaimTaken, naming the claim and its owner) instead of both rewriting its owner reference on
    every reconcile, and creates no children."""
    model_cache.provide_volume(cached_deployment("any", namespace), namespace)
    kube.apply(cached_deployment("first", namespace), field_manager="disagg-tests", kind=DISAGG_DEPLOYMENT)
    wait_held_at_zero(kube, namespace, "first")
    owner = kube.get(DISAGG_DEPLOYMENT, namespace, "first")
    assert owner is not None
    kube.apply(cached_deployment("second", namespace), field_manager="disagg-tests", kind=DISAGG_DEPLOYMENT)
    degraded = poll(
        lambda: (
            condition(kube, namespace, "second", "Degraded").get("status") == "True"
            and condition(kube, namespace, "second", "Degraded")
        ),
        what="the second deployment Degraded",
    )
    assert degraded["reason"] == "ModelCacheClaimTaken", degraded
    assert CLAIM in degraded["message"] and "first" in degraded["message"], degraded
    # the claim keeps its owner; the second has no children
    after = kube.get(PVC, namespace, CLAIM)
    assert after is not None
    refs = [r["uid"] for r in after["metadata"].get("ownerReferences") or [] if r.get("controller")]
    assert refs == [owner["metadata"]["uid"]]
    assert kube.get(DEPLOYMENT, namespace, "second-decode") is None
    assert operator_process.alive()


def test_a_failed_download_job_degrades_with_a_warning_naming_it(
    model_cache: ModelCachePlayer, kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    model_cache.provide_volume(cached_deployment("any", namespace), namespace)
    kube.apply(cached_deployment("broken", namespace), field_manager="disagg-tests", kind=DISAGG_DEPLOYMENT)
    job = wait_held_at_zero(kube, namespace, "broken")
    name = job["metadata"]["name"]
    # the download runs past its deadline: the Job controller fails the Job (DeadlineExceeded)
    kube.request(
        "PATCH",
        JOB.path(namespace, name),
        query=[("fieldManager", "disagg-tests")],
        body={"spec": {"activeDeadlineSeconds": 1}},
        content_type=MERGE_PATCH,
    )
    degraded = poll(
        lambda: (
            condition(kube, namespace, "broken", "Degraded").get("status") == "True"
            and condition(kube, namespace, "broken", "Degraded")
        ),
        what="broken Degraded after its download Job failed",
    )
    assert degraded["reason"] == "ModelDownloadFailed" and name in degraded["message"]
    assert "DeadlineExceeded" in degraded["message"]
    assert condition(kube, namespace, "broken", "ModelCached")["reason"] == "DownloadFailed"
    assert condition(kube, namespace, "broken", "Progressing")["reason"] == "Blocked"

    def warning() -> list[JsonDict]:
        return [
            e
            for e in kube.list(EVENT, namespace)
            if (e.get("involvedObject") or {}).get("name") == "broken"
            and e.get("type") == "Warning"
            and e.get("reason") == "ModelDownloadFailed"
        ]

    events = poll(warning, what="a Warning Event ModelDownloadFailed")
    assert name in events[0]["message"]
    assert (
        replicas(kube, namespace, "broken-prefill") == 0 and replicas(kube, namespace, "broken-decode") == 0
    )
    assert replicas(kube, namespace, "broken-router") == 1
    # no crash loop, no retry storm: the failed Job stays, is not re-created, the operator keeps running
    assert [j["metadata"]["uid"] for j in kube.list(JOB, namespace)] == [job["metadata"]["uid"]]
    assert operator_process.alive()


@pytest.mark.parametrize(
    ("cache", "source", "message"),
    [
        ({"claimName": CLAIM}, {"pvc": {"claimName": "w"}}, CACHE_NEEDS_HUGGING_FACE),
        (
            {"claimName": CLAIM, "create": {"size": "1Gi", "accessMode": "ReadOnlyMany"}},
            None,
            READ_ONLY_CREATE_NEEDS_PREFILLED,
        ),
    ],
    ids=["pvc-source", "read-only-create"],
)
def test_the_api_server_refuses_an_unusable_cache_naming_the_field(
    kube: KubeApi, namespace: str, crds: list[str], cache: JsonDict, source: JsonDict | None, message: str
) -> None:
    body = cached_deployment("refused", namespace)
    body["spec"]["model"]["cache"] = cache
    if source is not None:
        body["spec"]["model"]["source"] = source
    with pytest.raises(ApiException) as error:
        kube.apply(body, field_manager="disagg-tests", kind=DISAGG_DEPLOYMENT)
    assert error.value.status == 422
    assert message in (error.value.body or "")
