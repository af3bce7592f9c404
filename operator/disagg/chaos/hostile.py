"""Hostile and broken DisaggregatedDeployments (issue 13, item 7), from plain tables of values and fields.

A valid example is mutated at up to three places: wrong types, numbers at and past their bounds, huge
strings, unicode and emoji, quantities such as ``256GB``, tolerations with operator ``Exist``,
parallelism that does not divide, and input that tries to take what the operator owns (a second
``--kv-transfer-config``, also spelled the ways vLLM's argument parser reads it, an ``HF_TOKEN`` env, a
podTemplate volume named ``dshm``), or fields removed.

The tables are shared: tests/integration/test_hostile_input.py draws from them with Hypothesis (dry runs,
every child checked), and the chaos case ``hostile-input`` (:func:`disagg.chaos.cases.hostile_input`)
draws with a seeded :class:`random.Random` and applies what the API server takes to a running operator.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
BASE_EXAMPLES = ("vllm-nixl", "sglang-mooncake", "sglang-nixl", "vllm-nixl-gateway")

FieldPath = tuple[str, ...]
Mutation = tuple[FieldPath, Any]


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE: Any = _Delete()  # a mutation that removes the field

# ------------------------------------------------------------------------------------------- values

WRONG_TYPES: tuple[Any, ...] = ("1", "one", 1.5, True, None, [], {}, [1], {"a": 1})
HUGE: tuple[str, ...] = ("a" * 63, "a" * 64, "a" * 253, "a" * 254, "a" * 1025, "a" * 5000, "x" * 40000)
UNICODE: tuple[str, ...] = (
    *("🦙", "llama-🦙", "Ünïcödé", "名前", "a b", " leading", "trailing ", "", "\t", "a\nb", "..", "../x"),
)
NUMBERS: tuple[int, ...] = (
    *(-1, 0, 1, 2, 3, 5, 7, 8, 59, 60, 64, 65, 100, 101, 1000, 1001, 1023, 1024, 2000, 2001, 3600),
    *(3601, 5600, 8000, 8998, 29000, 30000, 65535, 65536, 86400, 86401, 10_000_000, 10_000_001),
    *(2**31, 2**53, 2**63 - 1),
)
QUANTITIES: tuple[Any, ...] = (
    *("256GB", "1Gi", "1gi", "64Gi", "0.5", "500m", "-1", "-1Gi", "1e3", "1e999", "8", 8, 0, -4, 1.5),
    *("", "🦙", "1.2.3", "0x10", "+1", ".5", "5.", "Gi", "2E", "1Ei", "99999999999999999999"),
)
RESOURCE_NAMES: tuple[str, ...] = (
    *(
        "cpu",
        "memory",
        "ephemeral-storage",
        "nvidia.com/gpu",
        "example.com/foo",
        "foo",
        "🦙",
        "hugepages-2Mi",
    ),
)
LABEL_KEYS: tuple[str, ...] = ("nvidia.com/gpu.product", "zone", "a/b/c", "🦙", "-bad", "x" * 64, "")
LABEL_VALUES: tuple[str, ...] = ("NVIDIA-H100-80GB-HBM3", "", "a b", "🦙", "x" * 64, "-bad", "ok.value_1")
TOLERATION_VALUES: Mapping[str, tuple[Any, ...]] = {
    "key": ("nvidia.com/gpu", "", "🦙", "a b", "dedicated"),
    "operator": ("Exists", "Equal", "Exist", "exists", "", "Lt"),
    "value": ("present", "", "🦙", "x" * 64),
    "effect": ("NoSchedule", "PreferNoSchedule", "NoExecute", "Never", ""),
    "tolerationSeconds": (0, 30, -1, "30"),
}
OWNED_ARGS: tuple[list[str], ...] = (
    ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'],
    ['--kv-transfer-config={"kv_connector":"X"}'],
    ['--kv_transfer_config={"kv_connector":"X"}'],
    ["--kv_transfer_config", '{"kv_connector":"X"}'],
    ["--kv-transfer-config.kv_connector=X"],
    ["--kv-transfer-config.kv_role", "kv_both"],
    ["--port", "9000"],
    ["--port=9000"],
    ["--tensor_parallel_size=4"],
    ["--served_model_name", "other"],
    ["-tp", "2"],
    ["--tp-size=2"],
    ["--disaggregation-mode", "null"],
    ["--host", "0.0.0.0"],
    ["--enable-prefix-caching"],
    ["--max-num-seqs", "🦙"],
    ["--portal"],
    ["a" * 4096],
    ["a" * 4097],
    ["x"] * 129,
)
ENV_ITEMS: tuple[dict[str, Any], ...] = (
    {"name": "HF_TOKEN", "value": "hf_plaintext"},
    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "other", "key": "token"}}},
    {"name": "POD_NAMESPACE", "value": "elsewhere"},
    {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "1"},
    {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "0.0.0.0"},
    {"name": "NCCL_DEBUG", "value": "INFO"},
    {"name": "EMOJI", "value": "🦙"},
    {"name": "🦙", "value": "x"},
    {"name": "1BAD", "value": "x"},
    {"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "BIG", "value": "x" * 32769},
    {"name": "NOVALUE"},
    {"value": "nameless"},
)
POD_TEMPLATES: tuple[dict[str, Any], ...] = (
    {"spec": {"volumes": [{"name": "dshm", "hostPath": {"path": "/dev/shm"}}]}},
    {"spec": {"volumes": [{"name": "model", "emptyDir": {}}]}},
    {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}},
    {"spec": {"containers": [{"name": "engine", "env": [{"name": "HF_TOKEN", "value": "hf_x"}]}]}},
    {"spec": {"containers": [{"name": "engine", "env": [{"name": "EXTRA", "value": "1"}]}]}},
    {"metadata": {"labels": {"team": "infer"}}},
    {"metadata": {"annotations": {"note": "🦙"}}},
    {"spec": {"priorityClassName": "high"}},
)
PARALLELISM_VALUES: Mapping[str, tuple[Any, ...]] = {
    "tensor": (0, 1, 2, 3, 4, 8, 65),
    "pipeline": (1, 2, 3),
    "data": (1, 2, 3, 4, 16),
    "expert": (1, 2, 4, 8, 16),
    "dataParallelAttention": (True, False),
    "nodesPerReplica": (1, 2, 3),
    "gpusPerNode": (1, 2, 3, 4, 8),
}
AUTOSCALING_VARIANTS: tuple[dict[str, Any], ...] = (
    {"enabled": True},
    {"enabled": True, "policyRef": {"name": "chat"}, "mode": "passive"},
    {"prefill": {"minReplicas": 5, "maxReplicas": 2}},
    {"decode": {"minReplicas": 0, "maxReplicas": 1000}, "maxGPUs": 1},
)
UNKNOWN_FIELD: dict[str, Any] = {"spec": {"unknownField": 1}}  # merged at the top: pruned or refused
PVC_ESCAPE: dict[str, Any] = {"claimName": "weights", "path": "a/../../etc"}

# ------------------------------------------------------------------------------------------- fields

ROLES = ("prefill", "decode")
POOLS = (*ROLES, "common")
ROLE_INT_FIELDS = (
    "replicas",
    "tensorParallelSize",
    "shutdownTimeoutSeconds",
    "preStopSleepSeconds",
    "startupTimeoutSeconds",
    "maxUnavailable",
)
INT_FIELDS: tuple[FieldPath, ...] = (
    *(("spec", r, f) for r in ROLES for f in ROLE_INT_FIELDS),
    ("spec", "kvTransfer", "bootstrapPort"),
    ("spec", "kvTransfer", "sideChannelPort"),
    ("spec", "router", "port"),
    ("spec", "router", "replicas"),
    ("spec", "model", "maxModelLen"),
    ("spec", "replicas"),
    ("spec", "autoscaling", "maxGPUs"),
    ("spec", "autoscaling", "prefill", "minReplicas"),
    ("spec", "autoscaling", "decode", "maxReplicas"),
    ("spec", "kvTransfer", "rdma", "count"),
)
STRING_FIELDS: tuple[FieldPath, ...] = (
    ("metadata", "name"),
    ("spec", "model", "name"),
    ("spec", "model", "servedName"),
    ("spec", "model", "quantization"),
    ("spec", "model", "dtype"),
    ("spec", "model", "source", "huggingFace", "id"),
    ("spec", "model", "source", "huggingFace", "revision"),
    ("spec", "model", "source", "huggingFace", "tokenSecretRef", "name"),
    ("spec", "model", "source", "huggingFace", "tokenSecretRef", "key"),
    ("spec", "model", "cache", "claimName"),
    ("spec", "model", "cache", "create", "size"),
    ("spec", "model", "cache", "create", "storageClassName"),
    ("spec", "engine", "type"),
    ("spec", "engine", "image"),
    ("spec", "engine", "imagePullPolicy"),
    ("spec", "kvTransfer", "connector"),
    ("spec", "kvTransfer", "rdmaDevice"),
    ("spec", "kvTransfer", "bufferSize"),
    ("spec", "kvTransfer", "loadFailurePolicy"),
    ("spec", "kvTransfer", "rdma", "resourceName"),
    ("spec", "kvTransfer", "rdma", "networks"),
    ("spec", "router", "image"),
    ("spec", "router", "serviceType"),
    ("spec", "router", "type"),
    ("spec", "autoscaling", "policyRef", "name"),
    ("spec", "autoscaling", "mode"),
)
ARG_FIELDS: tuple[FieldPath, ...] = (("spec", "engine", "args"), *(("spec", r, "args") for r in ROLES))
ENV_FIELDS: tuple[FieldPath, ...] = (("spec", "engine", "env"), *(("spec", p, "env") for p in POOLS))
POD_TEMPLATE_FIELDS: tuple[FieldPath, ...] = tuple(("spec", p, "podTemplate") for p in POOLS)
TOLERATION_FIELDS: tuple[FieldPath, ...] = tuple(("spec", p, "tolerations") for p in (*POOLS, "router"))
NODE_SELECTOR_FIELDS: tuple[FieldPath, ...] = tuple(("spec", p, "nodeSelector") for p in (*POOLS, "router"))
RESOURCE_FIELDS: tuple[FieldPath, ...] = tuple(
    ("spec", r, "resources", k) for r in ROLES for k in ("requests", "limits")
)
PARALLELISM_FIELDS: tuple[FieldPath, ...] = tuple(("spec", r, "parallelism") for r in ROLES)
REMOVABLE_FIELDS: tuple[FieldPath, ...] = (
    ("spec", "model", "source", "huggingFace"),
    ("spec", "model", "cache"),
    ("spec", "autoscaling"),
)
PVC_SOURCE_FIELD: FieldPath = ("spec", "model", "source", "pvc")
AUTOSCALING_FIELD: FieldPath = ("spec", "autoscaling")
TOP: FieldPath = ()

# ------------------------------------------------------------------------------------------- building


def base_deployment(example: str) -> dict[str, Any]:
    """The DisaggregatedDeployment of ``examples/<example>.yaml``."""
    docs = yaml.safe_load_all((ROOT / "examples" / f"{example}.yaml").read_text())
    return dict(next(d for d in docs if d and d.get("kind") == "DisaggregatedDeployment"))


def set_path(obj: dict[str, Any], path: FieldPath, value: Any) -> dict[str, Any]:
    """Set (or with :data:`DELETE` remove) the field at ``path``, creating maps on the way; the empty path
    merges ``value``'s maps into the top level. Returns ``obj``."""
    if not path:
        for key, item in value.items():
            obj.setdefault(key, {}).update(item)
        return obj
    node = obj
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)
    return obj


def _optional_fields(rng: random.Random, table: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    return {k: rng.choice(list(v)) for k, v in table.items() if rng.random() < 0.5}


def _text(rng: random.Random) -> str:
    alphabet = "abcXYZ019-_./ 🦙é\t"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))


def random_mutation(rng: random.Random) -> Mutation:
    """One mutation, each family about as likely as in the Hypothesis strategy of the integration test."""
    family = rng.randrange(13)
    if family == 0:
        value = rng.choice([*NUMBERS, rng.randint(-(2**40), 2**40), *WRONG_TYPES])
        return rng.choice(INT_FIELDS), value
    if family == 1:
        return rng.choice(STRING_FIELDS), rng.choice([*HUGE, *UNICODE, _text(rng), *WRONG_TYPES])
    if family == 2:
        return rng.choice(ARG_FIELDS), list(rng.choice(OWNED_ARGS))
    if family == 3:
        return rng.choice(ENV_FIELDS), rng.sample(ENV_ITEMS, rng.randint(1, 2))
    if family == 4:
        return rng.choice(POD_TEMPLATE_FIELDS), rng.choice(POD_TEMPLATES)
    if family == 5:
        return rng.choice(TOLERATION_FIELDS), [
            _optional_fields(rng, TOLERATION_VALUES) for _ in range(rng.randint(0, 3))
        ]
    if family == 6:
        selector = {rng.choice(LABEL_KEYS): rng.choice(LABEL_VALUES) for _ in range(rng.randint(1, 2))}
        return rng.choice(NODE_SELECTOR_FIELDS), selector
    if family == 7:
        resources = {rng.choice(RESOURCE_NAMES): rng.choice(QUANTITIES) for _ in range(rng.randint(1, 2))}
        return rng.choice(RESOURCE_FIELDS), resources
    if family == 8:
        return rng.choice(PARALLELISM_FIELDS), _optional_fields(rng, PARALLELISM_VALUES)
    if family == 9:
        return rng.choice(REMOVABLE_FIELDS), DELETE
    if family == 10:
        return PVC_SOURCE_FIELD, PVC_ESCAPE
    if family == 11:
        return AUTOSCALING_FIELD, rng.choice(AUTOSCALING_VARIANTS)
    return TOP, UNKNOWN_FIELD


def hostile_deployment(rng: random.Random, max_mutations: int = 3) -> tuple[dict[str, Any], list[Mutation]]:
    """A base example mutated at 0..``max_mutations`` places, and the mutations."""
    obj = copy.deepcopy(base_deployment(rng.choice(BASE_EXAMPLES)))
    mutations = [random_mutation(rng) for _ in range(rng.randint(0, max_mutations))]
    for path, value in mutations:
        set_path(obj, path, value)
    return obj, mutations


def describe(mutations: Sequence[Mutation], limit: int = 300) -> str:
    """The mutations in one line, long values cut."""
    parts = []
    for path, value in mutations:
        shown = repr(value)
        parts.append(f"{'.'.join(path) or '<top>'}={shown[:60]}{'...' if len(shown) > 60 else ''}")
    text = "; ".join(parts) or "(unchanged)"
    return text[:limit]


# ------------------------------------------------------------------------------------------- checking


def _pod_specs(child: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    spec = child.get("spec") or {}
    template = spec.get("template") or {}
    if "spec" in template:
        yield template["spec"]
    lws = spec.get("leaderWorkerTemplate") or {}
    for key in ("leaderTemplate", "workerTemplate"):
        if "spec" in (lws.get(key) or {}):
            yield lws[key]["spec"]


def _flag(arg: str) -> str:
    """The option ``arg`` sets as vLLM's argument parser reads it: ``--a_b.c=v`` sets ``--a-b``."""
    if not arg.startswith("--"):
        return arg
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def owned_field_problems(children: Sequence[Mapping[str, Any]], engine: str) -> list[str]:
    """What user input took of what the operator owns in ``children`` (rendered or live): a pod's
    ``HF_TOKEN`` not from a secretKeyRef or set twice, the engine's KV-transfer flag not exactly once
    (spelled as vLLM's parser reads it), the engine pod's ``dshm`` volume not one in-memory emptyDir."""
    problems: list[str] = []
    for child in children:
        where = f"{child['kind']}/{child['metadata']['name']}"
        for pod in _pod_specs(child):
            for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
                tokens = [_flag(str(a)) for a in [*container.get("command", []), *container.get("args", [])]]
                for env in container.get("env", []):
                    if env.get("name") == "HF_TOKEN" and "secretKeyRef" not in (env.get("valueFrom") or {}):
                        problems.append(f"{where} {container['name']}: HF_TOKEN not from a secretKeyRef")
                if sum(e.get("name") == "HF_TOKEN" for e in container.get("env", [])) > 1:
                    problems.append(f"{where} {container['name']}: HF_TOKEN twice")
                if container.get("name") != "engine":
                    continue
                if engine == "vllm" and tokens.count("--kv-transfer-config") != 1:
                    problems.append(f"{where}: --kv-transfer-config {tokens.count('--kv-transfer-config')}x")
                if engine == "sglang" and tokens.count("--disaggregation-transfer-backend") != 1:
                    problems.append(f"{where}: --disaggregation-transfer-backend not exactly once")
            if any(c.get("name") == "engine" for c in pod.get("containers", [])):
                dshm = [v for v in pod.get("volumes", []) if v.get("name") == "dshm"]
                if len(dshm) != 1 or (dshm[0].get("emptyDir") or {}).get("medium") != "Memory":
                    problems.append(f"{where}: dshm volumes {dshm}")
    return problems
