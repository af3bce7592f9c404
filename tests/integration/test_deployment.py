"""The reconciler against the real local control plane, with the operator running as a real process.

Every example becomes Ready with owned children; deletion cascades through the garbage collector; hand
edits and deletions of children are undone; spec changes scale and prune; the autoscaler's desired replicas
reach the pools; an object the schema accepts but the operator cannot use is Degraded with an Event while
the operator keeps serving other objects.
"""

from __future__ import annotations

import base64
import copy
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from disagg.api.deployment import DisaggregatedDeployment
from disagg.chaos.cases import apply_when_served
from disagg.cluster.wait import wait_for
from disagg.demo.scenario import tiny_deployment_manifest
from disagg.k8s.apply import DEPLOYMENT_LABEL, owner_reference
from disagg.k8s.client import (
    APPLY_PATCH,
    CHILD_KINDS,
    CONFIGMAP,
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    EVENT,
    KOPF_PEERING,
    MERGE_PATCH,
    POD,
    RATIO_POLICY,
    SERVICE,
    SERVICEACCOUNT,
    JsonDict,
    Kind,
    KubeApi,
)
from disagg.render import render_children

if TYPE_CHECKING:
    from conftest import ModelCachePlayer, OperatorFactory, OperatorProcess  # tests/integration/conftest.py

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SECRET = Kind("v1", "Secret", "secrets")
PERSISTENT_VOLUME = Kind("v1", "PersistentVolume", "persistentvolumes", namespaced=False)
PERSISTENT_VOLUME_CLAIM = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
APPLIABLE = {(k.api_version, k.kind): k for k in (DISAGG_DEPLOYMENT, RATIO_POLICY, SECRET, *CHILD_KINDS)}
READY_TIMEOUT_S = 120.0
GC_TIMEOUT_S = 120.0
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"

ChildKey = tuple[str, str]


def poll(check: Callable[[], Any], timeout_s: float = 60.0, interval_s: float = 0.25, what: str = "") -> Any:
    """The project's polling helper (disagg.cluster.wait.wait_for), typed loosely for tests."""
    return wait_for(check, timeout_s, interval_s, what)


tiny_deployment = tiny_deployment_manifest


def apply(kube: KubeApi, obj: JsonDict) -> JsonDict:
    kind = APPLIABLE.get((obj["apiVersion"], obj["kind"]))
    assert kind is not None, f"the tests do not apply {obj['apiVersion']}/{obj['kind']}"
    return kube.apply(obj, field_manager="disagg-tests", kind=kind)


def get_dd(kube: KubeApi, namespace: str, name: str) -> JsonDict:
    obj = kube.get(DISAGG_DEPLOYMENT, namespace, name)
    assert obj is not None, f"DisaggregatedDeployment {namespace}/{name} is gone"
    return obj


def condition(obj: JsonDict, type_: str) -> JsonDict:
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_]
    return found[0] if found else {}


def expected_children(obj: JsonDict) -> set[ChildKey]:
    """What the renderer says this object's children are (the pure function the operator also uses)."""
    dd = DisaggregatedDeployment.model_validate(obj)
    return {(c["kind"], c["metadata"]["name"]) for c in render_children(dd)}


def children(kube: KubeApi, namespace: str, name: str) -> dict[ChildKey, JsonDict]:
    """Objects carrying the deployment label, whoever owns them."""
    found: dict[ChildKey, JsonDict] = {}
    for kind in CHILD_KINDS:
        for obj in kube.list(kind, namespace, label_selector=f"{DEPLOYMENT_LABEL}={name}"):
            found[(obj["kind"], obj["metadata"]["name"])] = obj
    return found


def owned_by(obj: JsonDict, owner: JsonDict) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(
        r.get("uid") == owner["metadata"]["uid"] and r.get("controller") and r.get("blockOwnerDeletion")
        for r in refs
    )


def wait_children(kube: KubeApi, owner: JsonDict) -> dict[ChildKey, JsonDict]:
    """Wait until exactly the rendered children exist, each controlled by the owner."""
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    want = expected_children(owner)

    def present() -> dict[ChildKey, JsonDict] | None:
        have = children(kube, namespace, name)
        if set(have) == want and all(owned_by(obj, owner) for obj in have.values()):
            return have
        return None

    result: dict[ChildKey, JsonDict] = poll(present, what=f"children {sorted(want)} of {name}")
    return result


def wait_ready(kube: KubeApi, namespace: str, name: str) -> JsonDict:
    """Wait until status says Ready for the current generation (not a Ready left from an older spec)."""

    def ready() -> JsonDict | None:
        obj = get_dd(kube, namespace, name)
        generation = obj["metadata"]["generation"]
        found = condition(obj, "Ready")
        current = (obj.get("status") or {}).get("observedGeneration") == generation
        if current and found.get("status") == "True" and found.get("observedGeneration") == generation:
            return obj
        return None

    result: JsonDict = poll(ready, timeout_s=READY_TIMEOUT_S, what=f"{name} Ready")
    return result


def deployment_replicas(kube: KubeApi, namespace: str, name: str) -> int | None:
    obj = kube.get(DEPLOYMENT, namespace, name)
    return None if obj is None else int(obj["spec"]["replicas"])


def events_for(kube: KubeApi, namespace: str, name: str) -> list[JsonDict]:
    return [e for e in kube.list(EVENT, namespace) if (e.get("involvedObject") or {}).get("name") == name]


def provide_model_volume(kube: KubeApi, doc: JsonDict, namespace: str) -> str | None:
    """For a deployment whose weights come from a PVC: that claim, bound to a PersistentVolume made for it.

    Returns the PersistentVolume's name (cluster-scoped: the caller deletes it), None when not needed.
    """
    pvc = ((doc.get("spec") or {}).get("model") or {}).get("source", {}).get("pvc")
    if not pvc:
        return None
    claim, volume = pvc["claimName"], f"{namespace}-{pvc['claimName']}"[:63]
    size = {"storage": "200Gi"}
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": size,
                "accessModes": ["ReadOnlyMany", "ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": f"/models/{claim}"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        field_manager="disagg-tests",
        kind=PERSISTENT_VOLUME,
    )
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": size},
            },
        },
        field_manager="disagg-tests",
        kind=PERSISTENT_VOLUME_CLAIM,
    )
    return volume


def example_documents(path: Path, namespace: str) -> list[JsonDict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        doc.setdefault("metadata", {})["namespace"] = namespace
    return docs


def test_examples_exist() -> None:
    assert EXAMPLES, f"no examples under {ROOT / 'examples'}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_becomes_ready_with_owned_children(
    request: pytest.FixtureRequest,
    example: Path,
    kube: KubeApi,
    namespace: str,
    operator_process: OperatorProcess,
    model_cache: ModelCachePlayer,
) -> None:
    docs = example_documents(example, namespace)
    dds = [d for d in docs if d["kind"] == "DisaggregatedDeployment"]
    assert dds, f"{example.name} holds no DisaggregatedDeployment"
    volumes = [v for v in (provide_model_volume(kube, d, namespace) for d in dds) if v]
    request.addfinalizer(lambda: [kube.delete(PERSISTENT_VOLUME, None, v) for v in volumes])
    for doc in dds:
        model_cache.provide_volume(doc, namespace)  # spec.model.cache: a volume for its claim
    for doc in docs:
        apply(kube, doc)
    for doc in dds:
        name = doc["metadata"]["name"]
        owner = get_dd(kube, namespace, name)
        wait_children(kube, owner)
        if doc["spec"]["model"].get("cache"):  # the pools wait for the download Job: let it succeed
            model_cache.complete_download(namespace, name)
        obj = wait_ready(kube, namespace, name)
        status = obj["status"]
        assert status["observedGeneration"] == obj["metadata"]["generation"]
        dd = DisaggregatedDeployment.model_validate(obj)
        for role in ("prefill", "decode"):
            want = dd.spec.role(role).replicas
            assert status[role]["display"] == f"{want}/{want}"
        assert status["ratio"] == f"{dd.spec.prefill.replicas}:{dd.spec.decode.replicas}"
        if dd.spec.router.gateway:  # clients enter through the Gateway: no router URL of ours
            assert status["router"].get("endpoint") is None
        else:
            assert status["router"]["endpoint"].startswith(f"http://{name}-router.{namespace}.svc:")
        assert condition(obj, "Degraded")["status"] == "False"

        # kubectl get dd: every printer column is filled (the API server's Table rendering)
        table = kube.request("GET", DISAGG_DEPLOYMENT.path(namespace, name), accept=TABLE)
        columns = [c["name"] for c in table["columnDefinitions"]]
        cells = dict(zip(columns, table["rows"][0]["cells"], strict=True))
        assert all(cells[c] not in (None, "") for c in columns), cells
        assert cells["Ready"] == "True"
        reasons = {e["reason"] for e in events_for(kube, namespace, name)}
        assert "ChildrenCreated" in reasons
    assert operator_process.alive()


def test_deleting_the_deployment_cascades_to_children(
    kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    apply(kube, tiny_deployment("gone", namespace))
    owner = get_dd(kube, namespace, "gone")
    created = wait_children(kube, owner)
    # the operator counts what it did on its metrics endpoint
    samples = operator_process.metrics()
    assert samples['disagg_operator_reconciles_total{result="ok"}'] >= 1
    assert samples['disagg_operator_child_changes_total{action="created"}'] >= len(created)
    assert kube.delete(DISAGG_DEPLOYMENT, namespace, "gone")
    # the garbage collector learns a new CRD's kind at its next discovery sync (every 30 s): be patient
    poll(
        lambda: not children(kube, namespace, "gone"),
        timeout_s=GC_TIMEOUT_S,
        what="the garbage collector to remove the children",
    )
    assert kube.get(DISAGG_DEPLOYMENT, namespace, "gone") is None


def test_hand_edits_and_deleted_children_are_restored(
    kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    apply(kube, tiny_deployment("drift", namespace))
    owner = get_dd(kube, namespace, "drift")
    before = wait_children(kube, owner)
    wait_ready(kube, namespace, "drift")

    # someone scales the decode pool by hand: the operator owns spec.replicas and takes it back
    kube.request(
        "PATCH",
        DEPLOYMENT.path(namespace, "drift-decode"),
        query=[("fieldManager", "kubectl-edit")],
        body={"spec": {"replicas": 5}},
        content_type=MERGE_PATCH,
    )
    poll(lambda: deployment_replicas(kube, namespace, "drift-decode") == 2, what="decode replicas back to 2")

    # someone strips the labels the operator sets from a Service (so even label selectors miss it)
    labels = before[("Service", "drift-prefill")]["metadata"]["labels"]
    kube.request(
        "PATCH",
        SERVICE.path(namespace, "drift-prefill"),
        query=[("fieldManager", "kubectl-edit")],
        body={"metadata": {"labels": dict.fromkeys(labels)}},
        content_type=MERGE_PATCH,
    )

    def labels_back() -> bool:
        svc = kube.get(SERVICE, namespace, "drift-prefill") or {}
        return dict(svc.get("metadata", {}).get("labels") or {}) == labels

    poll(labels_back, what="the prefill Service's labels restored")

    # someone deletes the router Service and the prefill Deployment
    old_uids = {
        key: before[key]["metadata"]["uid"]
        for key in (("Service", "drift-router"), ("Deployment", "drift-prefill"))
    }
    kube.delete(SERVICE, namespace, "drift-router")
    kube.delete(DEPLOYMENT, namespace, "drift-prefill")

    def recreated() -> bool:
        now = children(kube, namespace, "drift")
        return all(key in now and now[key]["metadata"]["uid"] != uid for key, uid in old_uids.items())

    poll(recreated, what="the deleted router Service and prefill Deployment recreated")
    wait_ready(kube, namespace, "drift")
    assert operator_process.alive()


def test_quantities_the_api_server_normalises_are_not_reapplied(
    kube: KubeApi, namespace: str, crds: list[str]
) -> None:
    """cpu "0.5" is stored as "500m", memory "1.5Gi" as "1536Mi": the next apply finds every child
    unchanged (it used to see drift and re-apply at every resync, forever)."""
    from disagg.k8s.apply import apply_children, matches, with_owner

    resources = {"requests": {"cpu": "0.5", "memory": "1.5Gi"}, "limits": {"cpu": "1.0", "memory": "2048Mi"}}
    owner = apply(
        kube, tiny_deployment("quantities", namespace, prefill={"replicas": 1, "resources": resources})
    )
    wanted = render_children(DisaggregatedDeployment.model_validate(owner))
    first = apply_children(kube, owner, wanted, field_manager="disagg-tests")
    assert first.created and not first.updated
    live = first.live[("Deployment", "quantities-prefill")]
    (engine,) = [c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"]
    assert engine["resources"]["requests"]["cpu"] == "500m"  # the server's canonical form
    assert engine["resources"]["limits"]["memory"] == "2Gi"
    second = apply_children(kube, owner, wanted, field_manager="disagg-tests")
    assert not second.created and not second.updated and not second.pruned
    assert sorted(second.unchanged) == sorted(first.created)
    assert all(matches(with_owner(c, owner), second.live[(c["kind"], c["metadata"]["name"])]) for c in wanted)


def test_a_fresh_apply_creates_first_and_prunes_leftovers_after(
    kube: KubeApi, namespace: str, crds: list[str]
) -> None:
    """A never-reconciled owner's children are applied without listing first; the listing afterwards
    still finds an owned leftover (an operator that died before recording its work) and prunes it, and
    a child that was already there is counted as updated (what it held before is not known)."""
    from disagg.k8s.apply import apply_children, with_owner

    owner = apply(kube, tiny_deployment("fresh", namespace))
    wanted = render_children(DisaggregatedDeployment.model_validate(owner))
    existing = next(c for c in wanted if c["kind"] == "ServiceAccount")
    kube.apply(with_owner(existing, owner), field_manager="disagg-tests")
    leftover = copy.deepcopy(existing)
    leftover["metadata"]["name"] = "fresh-leftover"
    kube.apply(with_owner(leftover, owner), field_manager="disagg-tests")

    result = apply_children(kube, owner, wanted, field_manager="disagg-tests", fresh=True)
    labels = sorted(f"{c['kind']}/{c['metadata']['name']}" for c in wanted)
    existing_label = f"ServiceAccount/{existing['metadata']['name']}"
    assert sorted(result.created + result.updated) == labels
    assert result.updated == [existing_label]
    assert result.pruned == ["ServiceAccount/fresh-leftover"]
    assert kube.get(SERVICEACCOUNT, namespace, "fresh-leftover") is None
    again = apply_children(kube, owner, wanted, field_manager="disagg-tests")  # listed first: all match
    assert sorted(again.unchanged) == labels and not again.created and not again.pruned


def test_a_served_name_beyond_the_basic_multilingual_plane_is_applied(
    kube: KubeApi, namespace: str, crds: list[str]
) -> None:
    """An emoji used to go out as a JSON surrogate-pair escape, which the API server's YAML reader of
    server-side apply bodies refuses: Degraded forever with 9 of 13 children. Now every child is applied
    and the engines are told the name exactly."""
    from disagg.k8s.apply import apply_children

    served = "llama-\U0001f680-caf\u00e9"
    spec = tiny_deployment("emoji", namespace)["spec"]
    spec["model"]["servedName"] = served
    owner = apply(kube, tiny_deployment("emoji", namespace, model=spec["model"]))
    assert owner["spec"]["model"]["servedName"] == served  # the object itself went through apply
    wanted = render_children(DisaggregatedDeployment.model_validate(owner))
    result = apply_children(kube, owner, wanted, field_manager="disagg-tests")
    assert sorted(result.created) == sorted(f"{c['kind']}/{c['metadata']['name']}" for c in wanted)
    live = kube.get(DEPLOYMENT, namespace, "emoji-decode")
    assert live is not None
    (engine,) = [c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"]
    assert engine["args"][engine["args"].index("--served-model-name") + 1] == served
    # the cause, for the record: the same apply with json.dumps' default ASCII escapes is refused
    service = next(c for c in wanted if c["kind"] == "Service")
    escaped = json.dumps({**service, "metadata": {**service["metadata"], "annotations": {"x": served}}})
    assert "\\ud83d\\ude80" in escaped  # the surrogate pair
    with pytest.raises(ApiException) as refused:
        kube.request(
            "PATCH",
            SERVICE.path(namespace, service["metadata"]["name"]),
            query=[("fieldManager", "disagg-tests"), ("force", "true")],
            body=escaped.encode(),
            content_type=APPLY_PATCH,
        )
    assert "invalid Unicode character escape code" in str(refused.value.body)


def test_a_restarted_operator_resumes_and_repairs_what_changed_meanwhile(
    kube: KubeApi, namespace: str, operator_factory: OperatorFactory
) -> None:
    first = operator_factory(["--standalone"])
    apply(kube, tiny_deployment("resume", namespace))
    wait_children(kube, get_dd(kube, namespace, "resume"))
    first.stop()
    kube.request(
        "PATCH",
        DEPLOYMENT.path(namespace, "resume-prefill"),
        query=[("fieldManager", "kubectl-edit")],
        body={"spec": {"replicas": 4}},
        content_type=MERGE_PATCH,
    )
    kube.delete(SERVICE, namespace, "resume-decode")
    operator_factory(["--standalone"])
    poll(lambda: deployment_replicas(kube, namespace, "resume-prefill") == 1, what="prefill back to 1")
    poll(lambda: kube.get(SERVICE, namespace, "resume-decode") is not None, what="decode Service recreated")
    wait_ready(kube, namespace, "resume")


def test_spec_changes_scale_the_pools_and_prune_what_is_no_longer_rendered(
    kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    spec = tiny_deployment("change", namespace)
    apply(kube, spec)
    first = wait_children(kube, get_dd(kube, namespace, "change"))
    owner = get_dd(kube, namespace, "change")
    # A child an earlier release rendered and this one no longer does (the LMCache configuration of a
    # pool, before vLLM+LMCache was refused): owned by the DD and labelled as its child.
    leftover = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "change-prefill-lmcache",
            "namespace": namespace,
            "labels": {DEPLOYMENT_LABEL: "change"},
            "ownerReferences": [owner_reference(owner)],
        },
        "data": {"lmcache.yaml": "enable_pd: true\n"},
    }
    kube.apply(leftover, field_manager="disagg-tests", kind=CONFIGMAP)
    assert ("ConfigMap", "change-prefill-lmcache") not in first

    changed = copy.deepcopy(spec)
    changed["spec"]["decode"] = {"replicas": 3}
    changed["spec"]["prefill"] = {"replicas": 2}
    apply(kube, changed)
    poll(lambda: deployment_replicas(kube, namespace, "change-decode") == 3, what="decode scaled to 3")
    poll(lambda: deployment_replicas(kube, namespace, "change-prefill") == 2, what="prefill scaled to 2")
    obj = wait_ready(kube, namespace, "change")
    assert obj["status"]["ratio"] == "2:3"
    assert obj["status"]["decode"]["display"] == "3/3"

    # the reconcile of that change prunes the owned child it no longer renders
    poll(
        lambda: kube.get(CONFIGMAP, namespace, "change-prefill-lmcache") is None,
        what="the no-longer-rendered ConfigMap pruned",
    )
    reasons = {e["reason"] for e in events_for(kube, namespace, "change")}
    assert {"ChildrenCreated", "ChildrenUpdated", "ChildrenPruned"} <= reasons


def test_autoscaler_desired_replicas_reach_the_pools(
    kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    bounds = {"minReplicas": 1, "maxReplicas": 4}
    spec = tiny_deployment(
        "auto",
        namespace,
        autoscaling={"enabled": True, "policyRef": {"name": "none"}, "prefill": bounds, "decode": bounds},
    )
    apply(kube, spec)
    wait_children(kube, get_dd(kube, namespace, "auto"))
    # the autoscaling loop's channel to the reconciler: status.autoscaling.desiredReplicas (decode 9 lies
    # outside the spec's bounds, as a decision made before they narrowed: held within them, and recorded)
    kube.merge_patch_status(
        DISAGG_DEPLOYMENT,
        namespace,
        "auto",
        {"autoscaling": {"mode": "active", "desiredReplicas": {"prefill": 3, "decode": 9}}},
    )
    poll(lambda: deployment_replicas(kube, namespace, "auto-prefill") == 3, what="prefill scaled to 3")
    poll(lambda: deployment_replicas(kube, namespace, "auto-decode") == 4, what="decode clamped to 4")

    def status_follows() -> bool:
        status = get_dd(kube, namespace, "auto").get("status") or {}
        return status.get("ratio") == "3:4"

    poll(status_follows, what="status.ratio 3:4")
    stale = poll(
        lambda: [e for e in events_for(kube, namespace, "auto") if e["reason"] == "StaleScalingDecision"],
        what="a StaleScalingDecision Event on auto",
    )
    assert "decode 9 outside minReplicas 1..maxReplicas 4" in stale[0]["message"], stale[0]["message"]


# podTemplate is free-form and only the API server checks an affinity in it: the CRD and the model accept a
# node-affinity operator that is none, the API server rejects the Deployment built from it (ApplyFailed)
_BOGUS_TERM = {"matchExpressions": [{"key": "gpu", "operator": "Bogus", "values": ["h200"]}]}
REFUSED_AFFINITY: JsonDict = {
    "spec": {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_BOGUS_TERM]}
            }
        }
    }
}


def test_unusable_object_is_degraded_with_an_event_while_the_operator_keeps_working(
    kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    bad = tiny_deployment("broken", namespace, prefill={"replicas": 1, "podTemplate": REFUSED_AFFINITY})
    apply(kube, bad)

    def degraded() -> JsonDict | None:
        obj = get_dd(kube, namespace, "broken")
        found = condition(obj, "Degraded")
        return found if found.get("status") == "True" else None

    found = poll(degraded, what="broken Degraded")
    assert found["reason"] == "ApplyFailed"
    assert "affinity" in found["message"], found["message"]
    obj = get_dd(kube, namespace, "broken")
    assert condition(obj, "Ready")["status"] == "False"
    assert condition(obj, "Progressing")["reason"] == "Blocked"
    warnings = poll(
        lambda: [e for e in events_for(kube, namespace, "broken") if e["type"] == "Warning"],
        what="a Warning Event on broken",
    )
    assert any(e["reason"] == "ApplyFailed" and "affinity" in e["message"] for e in warnings)

    # the operator is alive and still reconciles other objects
    apply(kube, tiny_deployment("healthy", namespace))
    wait_children(kube, get_dd(kube, namespace, "healthy"))
    wait_ready(kube, namespace, "healthy")
    assert operator_process.alive() and operator_process.healthy()

    # fixing the object clears Degraded
    apply(kube, tiny_deployment("broken", namespace))

    def recovered() -> bool:
        return condition(get_dd(kube, namespace, "broken"), "Degraded").get("status") == "False"

    poll(recovered, what="broken no longer Degraded")


def test_a_pod_template_taking_the_operators_volume_is_degraded_naming_the_field(
    kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    """podTemplate is free-form (CEL can't see into it): a volume named like the operator's /dev/shm is
    reported by the operator as Degraded naming the field, with a Warning Event; no child is created."""
    template = {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}
    apply(kube, tiny_deployment("shm", namespace, prefill={"replicas": 1, "podTemplate": template}))

    def degraded() -> JsonDict | None:
        found = condition(get_dd(kube, namespace, "shm"), "Degraded")
        return found if found.get("status") == "True" else None

    found = poll(degraded, what="shm Degraded")
    assert found["reason"] == "InvalidSpec"
    assert "spec.prefill.podTemplate" in found["message"] and "spec.volumes[0]" in found["message"]
    assert "'dshm' is the operator's" in found["message"]
    assert children(kube, namespace, "shm") == {}
    warnings = poll(
        lambda: [e for e in events_for(kube, namespace, "shm") if e["type"] == "Warning"],
        what="a Warning Event on shm",
    )
    assert any(e["reason"] == "InvalidSpec" and "dshm" in e["message"] for e in warnings)
    assert operator_process.alive()


KOPF_PEERING_CRDS = ROOT / "charts" / "disagg-operator" / "crds" / "kopf-peering.yaml"


def test_the_hugging_face_token_never_leaves_its_secret(
    kube: KubeApi, namespace: str, operator_process: OperatorProcess
) -> None:
    """A canary token in the Secret a deployment names: the pods reference it (secretKeyRef), and neither
    it nor its base64 appears in the operator's log or metrics, an Event, a DisaggregatedDeployment
    (spec, status, kopf's annotations) or any child or pod, on the paths that report an object: Ready,
    Degraded with InvalidSpec, and ApplyFailed (the API server's refusal, which the operator logs and
    puts in the condition and the Event)."""
    canary = f"hf_canary_{namespace[-6:]}_do_not_log"
    encoded = base64.b64encode(canary.encode()).decode()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-canary"},
        "stringData": {"token": canary},
    }
    kube.create(SECRET, namespace, secret)
    source = {
        "huggingFace": {"id": "Qwen/Qwen3-0.6B", "tokenSecretRef": {"name": "hf-canary", "key": "token"}}
    }
    model = {"name": "Qwen/Qwen3-0.6B", "source": source}
    apply(kube, tiny_deployment_manifest("canary", namespace, model=model))
    obj = get_dd(kube, namespace, "canary")
    kids = wait_children(kube, obj)
    wait_ready(kube, namespace, "canary")
    shm = {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}
    apply(
        kube, tiny_deployment_manifest("canary-invalid", namespace, model=model, prefill={"podTemplate": shm})
    )
    refused = {"podTemplate": REFUSED_AFFINITY}
    apply(kube, tiny_deployment_manifest("canary-refused", namespace, model=model, prefill=refused))
    for name, reason in (("canary-invalid", "InvalidSpec"), ("canary-refused", "ApplyFailed")):

        def degraded(name: str = name) -> JsonDict | None:
            found = condition(get_dd(kube, namespace, name), "Degraded")
            return found if found.get("status") == "True" else None

        assert poll(degraded, what=f"{name} Degraded")["reason"] == reason
        poll(lambda name=name: events_for(kube, namespace, name), what=f"an Event on {name}")

    # the token is wired, so the absence below is not vacuous
    engine_env = [
        env
        for child in kids.values()
        if child["kind"] == "Deployment"
        for container in child["spec"]["template"]["spec"]["containers"]
        for env in container.get("env", [])
        if env["name"] == "HF_TOKEN"
    ]
    assert engine_env, "no container takes HF_TOKEN"
    assert all(e["valueFrom"] == {"secretKeyRef": {"name": "hf-canary", "key": "token"}} for e in engine_env)

    places: dict[str, str] = {"operator log": operator_process.log_path.read_text(errors="replace")}
    with urllib.request.urlopen(operator_process.metrics_url, timeout=5) as response:
        places["operator metrics"] = response.read().decode()
    for kind in (*CHILD_KINDS, DISAGG_DEPLOYMENT, EVENT, POD):
        for found in kube.list(kind, namespace):
            places[f"{found['kind']}/{found['metadata']['name']}"] = json.dumps(found)
    assert len(places) > 15, sorted(places)
    leaks = [where for where, text in places.items() if canary in text or encoded in text]
    assert leaks == [], f"the token appears in {leaks}"


def test_peered_replicas_fail_over(kube: KubeApi, namespace: str, operator_factory: OperatorFactory) -> None:
    """Two operators peered via a KopfPeering (the chart's CRD): the standby acts once the active stops."""
    for crd in yaml.safe_load_all(KOPF_PEERING_CRDS.read_text()):
        kube.apply(crd, field_manager="disagg-tests")
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "disagg", "namespace": namespace},
    }
    poll(
        lambda: apply_when_served(kube, peering, KOPF_PEERING, "disagg-tests"),
        what="the KopfPeering CRD served",
    )
    args = ["--peering", "disagg", "--peering-lifetime", "10"]
    standby = operator_factory([*args, "--peering-priority", "10"])
    active = operator_factory([*args, "--peering-priority", "20"])

    apply(kube, tiny_deployment("ha", namespace))
    before = wait_children(kube, get_dd(kube, namespace, "ha"))
    active.stop()  # a graceful stop withdraws it from the peering at once
    kube.delete(SERVICE, namespace, "ha-router")

    def restored() -> bool:
        svc = kube.get(SERVICE, namespace, "ha-router")
        return (
            svc is not None and svc["metadata"]["uid"] != before[("Service", "ha-router")]["metadata"]["uid"]
        )

    poll(restored, what="the standby operator to restore the deleted router Service")
    assert standby.alive()
