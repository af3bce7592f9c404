"""The ``DisaggregatedDeployment`` API (disagg.dev/v1alpha1): a prefill pool, a decode pool, a router.

These models are the single source of truth: the CRD (schema, defaults, enums, CEL rules, printer
columns) is generated from them by :mod:`disagg.api.crd`. Every cross-field rule exists twice, as a CEL
rule the API server enforces (``x-kubernetes-validations`` in ``json_schema_extra``) and as a pydantic
validator with the same meaning, so ``disagg render`` rejects what ``kubectl apply`` would, naming the
field. The status (what the operator writes) is modelled in :mod:`disagg.api.status`. Pure: pydantic only.

Example (see examples/ for one per accepted engine and KV connector)::

    apiVersion: disagg.dev/v1alpha1
    kind: DisaggregatedDeployment
    metadata: {name: llama-70b}
    spec:
      model:
        name: meta-llama/Llama-3.1-70B-Instruct
        source: {huggingFace: {id: meta-llama/Llama-3.1-70B-Instruct}}
      engine: {type: vllm}
      kvTransfer: {connector: nixl}
      prefill: {replicas: 2, tensorParallelSize: 4}
      decode: {replicas: 1, tensorParallelSize: 8}
"""

from __future__ import annotations

import copy
import re
from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from disagg.api.common import (
    FREE_FORM_OBJECT,
    MAX_NAME_LENGTH,
    Affinity,
    ApiModel,
    ArgList,
    EnvList,
    FreeFormObject,
    LocalObjectReference,
    ResourceRequirements,
    SecretKeyRef,
    StringMap,
    TolerationList,
)
from disagg.api.owned import EngineArgList, EngineEnvList, PodTemplateOverride
from disagg.api.podtemplate import deep_merge
from disagg.api.ratiopolicy import Mode
from disagg.api.status import (
    MAX_DECISION_MESSAGE,
    MAX_STATUS_DECISIONS,
    AutoscalingStatus,
    DesiredReplicas,
    DisaggregatedDeploymentStatus,
    RoleStatus,
    RouterStatus,
    ScalingDecision,
    format_ratio,
)
from disagg.api.support import Connector, Engine, combination, support_rules

KIND = "DisaggregatedDeployment"
PLURAL = "disaggregateddeployments"
SINGULAR = "disaggregateddeployment"
SHORT_NAMES = ("dd", "disagg")

RoleName = Literal["prefill", "decode"]
ROLE_NAMES: tuple[RoleName, RoleName] = ("prefill", "decode")

# Which engine x KV connector combinations are accepted, and why the others are refused:
# disagg.api.support.SUPPORT_MATRIX (the CEL rules below and docs/deployment.md are generated from it).
GPU_RESOURCE = "nvidia.com/gpu"
# Children append at most "-prefill-headless" (17 characters) to the name, and a Service name must be a
# DNS-1035 label of at most 63 characters.
MAX_DD_NAME_LENGTH = 63 - len("-prefill-headless")
# A pool spanning several nodes is a LeaderWorkerSet NAME-prefill-lws whose worker StatefulSets are named
# NAME-prefill-lws-GROUP (GROUP up to 999: replicas <= 1000), and a StatefulSet's name must leave room for
# the controller-revision-hash label (NAME-HASH, 11 more characters, in a 63-character label value:
# kubernetes/kubernetes#64023), so at most 52 characters.
MAX_MULTI_NODE_DD_NAME_LENGTH = 52 - len("-prefill-lws-999")
MULTI_NODE_NAME_TOO_LONG = (
    f"metadata.name must be at most {MAX_MULTI_NODE_DD_NAME_LENGTH} characters when a pool spans several "
    "nodes (its LeaderWorkerSet's worker StatefulSets NAME-prefill-lws-GROUP must fit in 52)"
)
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """One CEL rule as the CRD's x-kubernetes-validations wants it."""
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


# ---------------------------------------------------------------------------------------------- model


class HuggingFaceSource(ApiModel):
    """Download the model from the Hugging Face Hub at start-up."""

    id: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=r"^[A-Za-z0-9][-._A-Za-z0-9]*(/[-._A-Za-z0-9]+)?$",
        description="Hugging Face repository id, e.g. meta-llama/Llama-3.1-70B-Instruct.",
    )
    revision: str | None = Field(
        default=None, max_length=MAX_NAME_LENGTH, description="Branch, tag or commit to load."
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a Hugging Face token (gated models); exposed as HF_TOKEN to the "
        "engine pods, or with model.cache to the download Job only.",
    )


class PvcSource(ApiModel):
    """Load the model from a PersistentVolumeClaim that already holds the weights."""

    claim_name: str = Field(
        min_length=1, max_length=MAX_NAME_LENGTH, description="Name of the PersistentVolumeClaim."
    )
    path: str = Field(
        default="",
        max_length=1024,
        pattern=r"^[^/].*$|^$",
        description="Directory of the model inside the volume (relative; empty for the volume root).",
    )


class ModelSource(ApiModel):
    """Where the weights come from: exactly one of huggingFace or pvc."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "(has(self.huggingFace) ? 1 : 0) + (has(self.pvc) ? 1 : 0) == 1",
                    "spec.model.source: set exactly one of huggingFace or pvc",
                )
            ]
        }
    )

    hugging_face: HuggingFaceSource | None = Field(default=None, description="A Hugging Face Hub repository.")
    pvc: PvcSource | None = Field(default=None, description="A PersistentVolumeClaim holding the weights.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.hugging_face is None) == (self.pvc is None):
            raise ValueError("spec.model.source: set exactly one of huggingFace or pvc")
        return self


# A PersistentVolumeClaim's name is a DNS-1123 subdomain (k8s.io/apimachinery validation.IsDNS1123Subdomain).
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Storage quantities a PVC request takes (the binary and decimal suffixes of resource.Quantity).
STORAGE_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
CACHE_NEEDS_HUGGING_FACE = (
    "spec.model.cache: needs spec.model.source.huggingFace (a pvc source already holds the weights)"
)
READ_ONLY_CREATE_NEEDS_PREFILLED = (
    "spec.model.cache.create.accessMode ReadOnlyMany needs spec.model.cache.prefilled: true (the download "
    "Job must write the volume; use ReadWriteMany to have the operator fill it)"
)


class ModelCacheCreate(ApiModel):
    """The PersistentVolumeClaim the operator creates for the cache (owned by the DisaggregatedDeployment)."""

    size: str = Field(
        min_length=1,
        max_length=32,
        pattern=STORAGE_QUANTITY,
        description="Storage the claim requests, e.g. 200Gi (a 70B model in bf16 takes about 140 GB).",
    )
    storage_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=DNS1123_SUBDOMAIN,  # what the API server requires of a claim's storageClassName
        description="StorageClass of the claim (default: the cluster's default StorageClass). It must "
        "provision volumes with the access mode below.",
    )
    access_mode: Literal["ReadWriteMany", "ReadOnlyMany"] = Field(
        default="ReadWriteMany",
        description="Access mode of the claim: ReadWriteMany (the download Job writes it, every engine pod "
        "on any node mounts it read-only) or ReadOnlyMany (only with prefilled: the volume is filled by "
        "other means, e.g. your storage class provisions it from a snapshot).",
    )


class ModelCacheSpec(ApiModel):
    """A PersistentVolumeClaim holding the Hugging Face cache of the model, shared by every engine pod.

    Filled once by a download Job the operator runs per model id and revision (unless prefilled); the
    pools run no replica until it has succeeded, then every pod mounts the claim read-only with
    HF_HUB_OFFLINE=1, so a scale-up loads the weights from the volume instead of downloading them again.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.create) || self.create.accessMode != 'ReadOnlyMany' || self.prefilled",
                    READ_ONLY_CREATE_NEEDS_PREFILLED,
                    ".create.accessMode",
                )
            ]
        }
    )

    claim_name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=DNS1123_SUBDOMAIN,
        description="Name of the PersistentVolumeClaim (same namespace). Without create it must exist and "
        "be mountable by every engine pod (ReadOnlyMany or ReadWriteMany).",
    )
    create: ModelCacheCreate | None = Field(
        default=None,
        description="Have the operator create the claim (deleted with the DisaggregatedDeployment); "
        "without it the claim is yours.",
    )
    prefilled: bool = Field(
        default=False,
        description="The claim already holds the model in the Hugging Face cache layout "
        "(models--ORG--NAME/...), filled by you: no download Job runs and the pools start at once.",
    )

    @model_validator(mode="after")
    def _read_only_create(self) -> Self:
        if self.create is not None and self.create.access_mode == "ReadOnlyMany" and not self.prefilled:
            raise ValueError(READ_ONLY_CREATE_NEEDS_PREFILLED)
        return self


class ModelSpec(ApiModel):
    """The model to serve."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule("!has(self.cache) || has(self.source.huggingFace)", CACHE_NEEDS_HUGGING_FACE, ".cache")
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        description="The model's name, e.g. meta-llama/Llama-3.1-70B-Instruct. Served under this name "
        "unless servedName is set.",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        description="Name clients put in the OpenAI 'model' field (default: name).",
    )
    source: ModelSource = Field(description="Where the weights come from (exactly one source).")
    max_model_len: int | None = Field(
        default=None, ge=1, le=10_000_000, description="Maximum context length in tokens (engine default)."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        default=None, description="Weight and activation data type (engine default: auto)."
    )
    quantization: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[a-z0-9_-]+$",
        description="Quantization method passed to the engine, e.g. fp8, awq, gptq.",
    )
    cache: ModelCacheSpec | None = Field(
        default=None,
        description="Cache the Hugging Face download on a PersistentVolumeClaim the pods mount read-only, "
        "filled once by a download Job (or prefilled by you), instead of every replica downloading the "
        "weights into an emptyDir. Only with source.huggingFace.",
    )

    @model_validator(mode="after")
    def _cache_source(self) -> Self:
        if self.cache is not None and self.source.hugging_face is None:
            raise ValueError(CACHE_NEEDS_HUGGING_FACE)
        return self

    @property
    def served(self) -> str:
        return self.served_name or self.name


# --------------------------------------------------------------------------------------------- engine


class EngineSpec(ApiModel):
    """The inference engine both pools run."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "self.type == oldSelf.type",
                    "spec.engine.type is immutable: create a new DisaggregatedDeployment to change engines",
                    ".type",
                )
            ]
        }
    )

    type: Engine = Field(description="Inference engine: vllm or sglang. Immutable.")
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Engine container image (default: a pinned official image per engine).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy of the engine containers."
    )
    args: EngineArgList = Field(
        default_factory=list, description="Extra engine arguments for both pools (appended after ours)."
    )
    env: EngineEnvList = Field(
        default_factory=list, description="Extra environment variables for both pools."
    )


# ------------------------------------------------------------------------------------------ kv transfer


# Ports the rendered pods use besides the connector ports a user picks (see disagg.render.settings):
# engine HTTP (vLLM 8000, SGLang 30000).
ENGINE_POD_PORTS = (8000, 30000)
# Router container ports besides spec.router.port: metrics 29000.
ROUTER_POD_PORTS = (29000,)
_TAKEN = f"({', '.join(map(str, ENGINE_POD_PORTS))})"


def _port_free_rule(expr: str) -> str:
    return f"!({expr} in {list(ENGINE_POD_PORTS)})"


def _port_taken(port: int) -> bool:
    return port in ENGINE_POD_PORTS


class RdmaSpec(ApiModel):
    """The RDMA NIC the KV transfer engine opens: a device-plugin resource, IPC_LOCK, a secondary network."""

    resource_name: str = Field(
        default="rdma/ib",
        min_length=1,
        max_length=253,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Extended resource of the RDMA device plugin, requested and limited on the engine "
        "container, e.g. rdma/ib or rdma/hca_shared_devices_a.",
    )
    count: int = Field(default=1, ge=1, le=64, description="How many of resourceName each engine pod gets.")
    networks: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Multus secondary networks of the engine pods (the k8s.v1.cni.cncf.io/networks "
        "annotation), e.g. ns/ib-net or ns/net-a,ns/net-b.",
    )


class KVTransferSpec(ApiModel):
    """How the prefill pool hands KV caches to the decode pool."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "self.bootstrapPort != self.sideChannelPort",
                    "spec.kvTransfer.bootstrapPort and spec.kvTransfer.sideChannelPort must differ",
                    ".sideChannelPort",
                ),
                _rule(
                    _port_free_rule("self.bootstrapPort"),
                    f"spec.kvTransfer.bootstrapPort must not be a port the engine pods use {_TAKEN}",
                    ".bootstrapPort",
                ),
                _rule(
                    _port_free_rule("self.sideChannelPort"),
                    f"spec.kvTransfer.sideChannelPort must not be a port the engine pods use {_TAKEN}",
                    ".sideChannelPort",
                ),
            ]
        }
    )

    connector: Connector = Field(
        description="KV connector: nixl for vLLM; mooncake or nixl for SGLang (the API refuses the other "
        "combinations, naming why: see the support matrix in docs/deployment.md)."
    )
    rdma_device: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=r"^[-_.,:A-Za-z0-9]+$",
        description="RDMA NIC name(s), e.g. mlx5_0 or mlx5_0,mlx5_1 (SGLang --disaggregation-ib-device, "
        "UCX_NET_DEVICES for vLLM NIXL). The device itself comes from rdma.",
    )
    rdma: RdmaSpec | None = Field(
        default=None,
        description="Give the engine pods an RDMA device: the device-plugin resource, IPC_LOCK (so the "
        "transfer engine can pin memory without a memlock limit) and optionally a Multus network.",
    )
    buffer_size: str | None = Field(
        default=None,
        max_length=32,
        pattern=r"^[0-9]+(Ki|Mi|Gi|Ti|K|M|G|T)?$",
        description="KV transfer buffer size as a quantity, e.g. 8Gi. No accepted connector uses it at "
        "present (it sized P2P NCCL and LMCache buffers); kept so existing objects stay valid.",
    )
    load_failure_policy: Literal["recompute", "fail"] = Field(
        default="recompute",
        description="vLLM kv_load_failure_policy: what decode does when a KV load fails: recompute the "
        "prefill locally, or fail the request.",
    )
    bootstrap_port: int = Field(
        default=8998,
        ge=1024,
        le=65535,
        description="Bootstrap port the prefill pods serve (Mooncake for vLLM and SGLang; SGLang NIXL).",
    )
    side_channel_port: int = Field(
        default=5600,
        ge=1024,
        le=65535,
        description="NIXL side-channel port of vLLM pods (VLLM_NIXL_SIDE_CHANNEL_PORT).",
    )
    extra_config: FreeFormObject | None = Field(
        default=None,
        description="Extra connector settings merged into vLLM's kv_connector_extra_config.",
    )


# ------------------------------------------------------------------------------------------ parallelism

# How a replica spreads over GPUs and nodes. Engine-neutral: a replica has tensor x pipeline x data
# engine ranks, one per GPU, on nodesPerReplica nodes of gpusPerNode GPUs each. vLLM takes the sizes
# as they are (--tensor-parallel-size, --pipeline-parallel-size, --data-parallel-size; its expert-parallel
# group is every tensor and data rank: vllm 0.33.0 wheel, vllm/config/parallel.py); SGLang's tensor-parallel
# group holds the attention data-parallel ranks (--tp-size tensor x data --attn-dp-size data: sglang 0.5.23
# wheel, sglang/srt/arg_groups/fields/parallel.py attn_dp_size). See disagg.render.engines.
DP_ATTENTION_NEEDS_DATA = (
    "parallelism.dataParallelAttention needs parallelism.data > 1 (the attention data-parallel ranks)"
)
EXPERT_DATA_NEEDS_DP_ATTENTION = (
    "parallelism.expert with parallelism.data > 1 needs parallelism.dataParallelAttention: true (the "
    "data-parallel ranks run attention apart and share one expert-parallel group)"
)
TENSOR_SIZES_DIFFER = (
    "tensorParallelSize and parallelism.tensor differ: set one of them (tensorParallelSize is the "
    "shorthand for parallelism.tensor; leave it at 1 when parallelism.tensor is set)"
)
EXPERT_SIZE = (
    "parallelism.expert must equal parallelism.tensor x parallelism.data (the engines shard the experts "
    "over every tensor and data rank of a replica)"
)
RANKS_FIT_NODES = (
    "parallelism: tensor x pipeline x data must equal gpusPerNode x nodesPerReplica (one engine rank per "
    "GPU of the replica's nodes)"
)


class Parallelism(ApiModel):
    """How one replica spreads over GPUs and nodes: tensor x pipeline x data engine ranks, one per GPU,
    on nodesPerReplica nodes of gpusPerNode GPUs each. A replica of one node is a Deployment's pod; a
    replica of several nodes is one LeaderWorkerSet group (a leader pod and nodesPerReplica - 1 workers).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "!self.dataParallelAttention || self.data > 1",
                    DP_ATTENTION_NEEDS_DATA,
                    ".dataParallelAttention",
                ),
                _rule(
                    "!has(self.expert) || self.data == 1 || self.dataParallelAttention",
                    EXPERT_DATA_NEEDS_DP_ATTENTION,
                    ".dataParallelAttention",
                ),
            ]
        }
    )

    tensor: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Tensor-parallel size (default: tensorParallelSize, of which this is the long form).",
    )
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel size.")
    data: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Data-parallel size: engine ranks each holding a full copy of the attention (and, "
        "without expert, of the whole model), spread over the replica's nodes.",
    )
    expert: int | None = Field(
        default=None,
        ge=2,
        le=4096,
        description="Expert-parallel size (unset: no expert parallelism). Must equal tensor x data: the "
        "experts of a mixture-of-experts model are sharded over every tensor and data rank (vLLM "
        "--enable-expert-parallel, SGLang --ep-size), dispatched by DeepEP all-to-all: high-throughput "
        "(normal) on prefill, low-latency on decode.",
    )
    data_parallel_attention: bool = Field(
        default=False,
        description="Run attention data-parallel over the data ranks while the MoE layers are expert-"
        "parallel over all of them (SGLang --attn-dp-size; vLLM's data ranks always do). Needs data > 1.",
    )
    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Nodes one replica spans. 1: each replica is a pod of a Deployment; more: each replica "
        "is a LeaderWorkerSet group of this many pods, one per node (needs the LeaderWorkerSet controller, "
        "sigs.k8s.io/lws).",
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs of each pod of a replica (default: tensor x pipeline x data / nodesPerReplica); "
        "nvidia.com/gpu is set to it.",
    )

    @model_validator(mode="after")
    def _self_consistent(self) -> Self:
        if self.data_parallel_attention and self.data == 1:
            raise ValueError(DP_ATTENTION_NEEDS_DATA)
        if self.expert is not None and self.data > 1 and not self.data_parallel_attention:
            raise ValueError(EXPERT_DATA_NEEDS_DP_ATTENTION)
        return self


def _cel_tensor(role: str) -> str:
    """CEL: the tensor-parallel size of the RoleSpec at ``role`` (``self`` or ``self.prefill``)."""
    return f"(has({role}.parallelism.tensor) ? {role}.parallelism.tensor : {role}.tensorParallelSize)"


def _cel_ranks(role: str) -> str:
    """CEL: engine ranks (GPUs) of one replica of the RoleSpec at ``role``, which has parallelism."""
    return f"({_cel_tensor(role)} * {role}.parallelism.pipeline * {role}.parallelism.data)"


def _cel_gpus_per_pod(role: str) -> str:
    """CEL: GPUs per pod of the RoleSpec at ``role``."""
    par = f"{role}.parallelism"
    per_node = f"(has({par}.gpusPerNode) ? {par}.gpusPerNode : {_cel_ranks(role)} / {par}.nodesPerReplica)"
    return f"(has({par}) ? {per_node} : {role}.tensorParallelSize)"


def _cel_gpus_per_replica(role: str) -> str:
    """CEL: GPUs of one replica (all its nodes) of the RoleSpec at ``role``."""
    return f"(has({role}.parallelism) ? {_cel_ranks(role)} : {role}.tensorParallelSize)"


def _gpu_resource_rule(kind: str) -> dict[str, Any]:
    return _rule(
        f"!has(self.resources) || !has(self.resources.{kind}) || "
        f"!('{GPU_RESOURCE}' in self.resources.{kind}) || "
        f"string(self.resources.{kind}['{GPU_RESOURCE}']) == string({_cel_gpus_per_pod('self')})",
        f"resources.{kind}['{GPU_RESOURCE}'] must equal tensorParallelSize (GPUs per replica), or with "
        "parallelism its gpusPerNode (GPUs per pod)",
        f".resources.{kind}",
    )


# ------------------------------------------------------------------------------------------------ roles


class RoleSpec(ApiModel):
    """One pool of engine replicas (prefill or decode)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _gpu_resource_rule("limits"),
                _gpu_resource_rule("requests"),
                _rule(
                    "!has(self.parallelism) || !has(self.parallelism.tensor) || self.tensorParallelSize == 1 "
                    "|| self.tensorParallelSize == self.parallelism.tensor",
                    TENSOR_SIZES_DIFFER,
                    ".parallelism.tensor",
                ),
                _rule(
                    "!has(self.parallelism) || !has(self.parallelism.expert) || self.parallelism.expert == "
                    f"{_cel_tensor('self')} * self.parallelism.data",
                    EXPERT_SIZE,
                    ".parallelism.expert",
                ),
                _rule(
                    "!has(self.parallelism) || (has(self.parallelism.gpusPerNode) ? "
                    f"{_cel_ranks('self')} == self.parallelism.gpusPerNode * self.parallelism.nodesPerReplica"
                    f" : {_cel_ranks('self')} % self.parallelism.nodesPerReplica == 0)",
                    RANKS_FIT_NODES,
                    ".parallelism",
                ),
            ]
        }
    )

    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Replicas when autoscaling is off, and the starting point when it is on.",
    )
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Tensor-parallel size: GPUs per replica (the shorthand for parallelism.tensor; with "
        "parallelism, leave it at 1 or set the same value).",
    )
    parallelism: Parallelism | None = Field(
        default=None,
        description="Tensor, pipeline, data and expert parallelism and the nodes a replica spans "
        "(unset: tensorParallelSize GPUs on one node).",
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description=f"Engine container resources. {GPU_RESOURCE} is set to tensorParallelSize (with "
        "parallelism: its gpusPerNode); if given it must equal it.",
    )
    node_selector: StringMap | None = Field(
        default=None,
        description="Node labels the pods require, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}.",
    )
    tolerations: TolerationList | None = Field(default=None, description="Pod tolerations (Kubernetes form).")
    affinity: Affinity | None = Field(default=None, description="Pod affinity (Kubernetes form).")
    args: EngineArgList = Field(
        default_factory=list, description="Extra engine arguments for this pool only."
    )
    env: EngineEnvList = Field(
        default_factory=list, description="Extra environment variables for this pool only."
    )
    pod_template: PodTemplateOverride | None = Field(
        default=None,
        description="Pod template override ({metadata, spec}) merged over the rendered pod template as a "
        "strategic merge patch would, for what the fields above don't cover: containers, volumes and env "
        "merge by name, volumeMounts by mountPath, ports by containerPort; a volume or env var of the "
        "same name is replaced, not merged; other lists are replaced.",
    )
    shutdown_timeout_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="Seconds a stopping engine drains in-flight requests (vLLM --shutdown-timeout).",
    )
    pre_stop_sleep_seconds: int = Field(
        default=5,
        ge=0,
        le=300,
        description="Seconds the preStop hook waits so routers stop sending before SIGTERM.",
    )
    startup_timeout_seconds: int = Field(
        default=1800,
        ge=60,
        le=86400,
        description="How long a replica may take to load the model before it is restarted.",
    )
    max_unavailable: int = Field(
        default=1, ge=0, le=1000, description="PodDisruptionBudget maxUnavailable for this pool."
    )

    @model_validator(mode="after")
    def _parallelism_arithmetic(self) -> Self:
        par = self.parallelism
        if par is None:
            return self
        if par.tensor is not None and self.tensor_parallel_size not in (1, par.tensor):
            raise ValueError(
                f"{TENSOR_SIZES_DIFFER}: tensorParallelSize {self.tensor_parallel_size}, parallelism.tensor "
                f"{par.tensor}"
            )
        tensor = self.tensor_size
        if par.expert is not None and par.expert != tensor * par.data:
            raise ValueError(f"{EXPERT_SIZE}: {par.expert} != {tensor} x {par.data}")
        ranks = tensor * par.pipeline * par.data
        fits = (
            ranks == par.gpus_per_node * par.nodes_per_replica
            if par.gpus_per_node is not None
            else ranks % par.nodes_per_replica == 0
        )
        if not fits:
            per_node = par.gpus_per_node if par.gpus_per_node is not None else "?"
            raise ValueError(
                f"{RANKS_FIT_NODES}: {tensor} x {par.pipeline} x {par.data} = {ranks} ranks on "
                f"{par.nodes_per_replica} nodes of {per_node} GPUs"
            )
        return self

    @model_validator(mode="after")
    def _gpus_match_tp(self) -> Self:
        if self.resources is None:
            return self
        for kind in ("limits", "requests"):
            values = getattr(self.resources, kind) or {}
            if GPU_RESOURCE in values and str(values[GPU_RESOURCE]) != str(self.gpus_per_node):
                what = "tensorParallelSize" if self.parallelism is None else "parallelism's gpusPerNode"
                raise ValueError(
                    f"resources.{kind}['{GPU_RESOURCE}'] ({values[GPU_RESOURCE]}) must equal "
                    f"tensorParallelSize (GPUs per replica), or with parallelism its gpusPerNode (GPUs per "
                    f"pod): {what} is {self.gpus_per_node}"
                )
        return self

    @property
    def tensor_size(self) -> int:
        """The tensor-parallel size: parallelism.tensor, else tensorParallelSize."""
        par = self.parallelism
        return par.tensor if par is not None and par.tensor is not None else self.tensor_parallel_size

    @property
    def pipeline_size(self) -> int:
        return self.parallelism.pipeline if self.parallelism is not None else 1

    @property
    def data_size(self) -> int:
        return self.parallelism.data if self.parallelism is not None else 1

    @property
    def expert_size(self) -> int | None:
        """The expert-parallel size, or None without expert parallelism."""
        return self.parallelism.expert if self.parallelism is not None else None

    @property
    def data_parallel_attention(self) -> bool:
        return self.parallelism is not None and self.parallelism.data_parallel_attention

    @property
    def nodes_per_replica(self) -> int:
        return self.parallelism.nodes_per_replica if self.parallelism is not None else 1

    @property
    def multi_node(self) -> bool:
        """Whether a replica spans several nodes (a LeaderWorkerSet group rather than a pod)."""
        return self.nodes_per_replica > 1

    @property
    def gpus_per_node(self) -> int:
        """GPUs of each pod of a replica (nvidia.com/gpu of the engine container)."""
        par = self.parallelism
        if par is None:
            return self.tensor_parallel_size
        if par.gpus_per_node is not None:
            return par.gpus_per_node
        return self.tensor_size * par.pipeline * par.data // par.nodes_per_replica

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one replica, all its nodes together (what the GPU budget counts)."""
        return self.gpus_per_node * self.nodes_per_replica


# ---------------------------------------------------------------------------------------------- common


class CommonSpec(ApiModel):
    """Pod settings both pools inherit; a pool may override each of them (spec.prefill, spec.decode).

    What a pool renders with is its effective spec: :meth:`DisaggregatedDeploymentSpec.role`, the same for
    the renderer, the autoscaler's bounds (the GPU a nodeSelector names) and the twin. The merge, field by
    field: nodeSelector key by key (the pool's value wins), tolerations concatenated (common's first),
    affinity the pool's when set (an empty {} clears common's), otherwise common's, env by name (the
    pool's variable wins, in common's position), podTemplate the pool's merged over common's with the
    rules a podTemplate merges over the rendered pod.
    """

    node_selector: StringMap | None = Field(
        default=None,
        description="Node labels both pools' pods require, merged key by key with a pool's nodeSelector "
        "(the pool's value wins for a key both set).",
    )
    tolerations: TolerationList | None = Field(
        default=None,
        description="Pod tolerations (Kubernetes form) of both pools, followed by a pool's own "
        "(concatenated, common's first).",
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Pod affinity (Kubernetes form) of both pools; a pool's affinity, when set, replaces "
        "it whole (set {} on a pool to drop it there).",
    )
    env: EngineEnvList = Field(
        default_factory=list,
        description="Extra environment variables of both pools' engine containers, after spec.engine.env "
        "(a variable of the same name wins over it); merged by name with a pool's env (the pool's wins).",
    )
    pod_template: PodTemplateOverride | None = Field(
        default=None,
        description="Pod template override ({metadata, spec}) of both pools. A pool's podTemplate is merged "
        "over it (containers, volumes and env by name, volumeMounts by mountPath, ports by containerPort, a "
        "volume or env var of the same name replaced, other lists replaced), and the result over the "
        "rendered pod template as a pool's podTemplate alone would be.",
    )

    def under(self, own: RoleSpec) -> RoleSpec:
        """``own`` with these settings merged in: the pool's effective spec (see the class)."""
        env = {item.name: item for item in [*self.env, *own.env]}  # the pool's wins, first position kept
        pod_template = own.pod_template
        if self.pod_template and own.pod_template:
            pod_template = deep_merge(copy.deepcopy(self.pod_template), own.pod_template)
        elif self.pod_template:
            pod_template = copy.deepcopy(self.pod_template)
        return own.model_copy(
            update={
                "node_selector": {**(self.node_selector or {}), **(own.node_selector or {})} or None,
                "tolerations": [*(self.tolerations or []), *(own.tolerations or [])] or None,
                "affinity": own.affinity if own.affinity is not None else self.affinity,
                "env": list(env.values()),
                "pod_template": pod_template,
            }
        )


# ----------------------------------------------------------------------------------------------- router

RouterType = Literal["builtin", "gateway-api"]
# The engine pod ports the gateway-api layout adds (disagg.render.gateway): on decode pods the engine
# moves this far up from its usual port, which the llm-d routing sidecar takes over.
GATEWAY_ENGINE_PORT_OFFSET = 200
GATEWAY_API_NEEDS_TYPE = (
    "spec.router.gatewayApi is set but spec.router.type is builtin: set spec.router.type: gateway-api, or "
    "remove spec.router.gatewayApi"
)
GATEWAY_API_NO_IMAGE = (
    "spec.router.image is the built-in router's image: with spec.router.type gateway-api set "
    "spec.router.gatewayApi.endpointPicker.image instead"
)
GATEWAY_API_NO_ARGS = (
    "spec.router.args are the built-in router's arguments: with spec.router.type gateway-api set "
    "spec.router.gatewayApi.endpointPicker.args instead"
)
GATEWAY_API_SERVICE_TYPE = (
    "spec.router.serviceType exposes the built-in router: with spec.router.type gateway-api clients enter "
    "through the Gateway (spec.router.gatewayApi.gateway), so leave it at ClusterIP"
)
GATEWAY_API_MULTI_NODE = (
    "spec.router.type gateway-api does not serve pools whose replicas span several nodes "
    "(parallelism.nodesPerReplica > 1): the InferencePool would select their workers, which serve no HTTP"
)
# Gateway API's object names and section names (sigs.k8s.io/gateway-api v1.6.3, apis/v1/shared_types.go:
# ObjectName, Namespace, SectionName).
GATEWAY_NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class GatewayParentRef(ApiModel):
    """The Gateway the HTTPRoute attaches to (a Gateway API parentRef of kind Gateway)."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Gateway.")
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=GATEWAY_NAMESPACE,
        description="Namespace of the Gateway (default: this object's). A Gateway in another namespace "
        "must allow routes from this one (its listeners' allowedRoutes).",
    )
    section_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="Listener of the Gateway to attach to (default: every listener that allows the route).",
    )


class EndpointPickerSpec(ApiModel):
    """The endpoint picker (EPP) the Gateway asks where each request goes: the llm-d inference scheduler,
    configured for prefill/decode disaggregation."""

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Endpoint picker image (default: the pinned llm-d inference scheduler release).",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=10,
        description="Endpoint picker replicas (each keeps its own prefix-cache index).",
    )
    args: ArgList = Field(default_factory=list, description="Extra endpoint picker arguments (after ours).")
    config: FreeFormObject | None = Field(
        default=None,
        description="An EndpointPickerConfig (inference.networking.x-k8s.io/v1alpha1) replacing the rendered "
        "P/D one whole (default: prefill and decode profiles filtered by the llm-d.ai/role pod label, "
        "prefix-cache and queue scorers, a max-score picker, and the prefix-based P/D decider).",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Endpoint picker container resources."
    )


class GatewayApiSpec(ApiModel):
    """Routing through the Gateway API Inference Extension: an InferencePool over both pools, its endpoint
    picker, the llm-d routing sidecar in the decode pods, and optionally an HTTPRoute from a Gateway."""

    endpoint_picker: EndpointPickerSpec = Field(
        default_factory=EndpointPickerSpec,
        description="The endpoint picker (EPP).",
        json_schema_extra={"default": {}},
    )
    gateway: GatewayParentRef | None = Field(
        default=None,
        description="The Gateway whose HTTPRoute sends this model's requests to the InferencePool (no "
        "HTTPRoute when unset: attach your own route to the InferencePool).",
    )
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="What the Gateway does when the endpoint picker does not answer: FailClose refuses the "
        "request, FailOpen sends it to an endpoint of its own choosing (InferencePool "
        "endpointPickerRef.failureMode).",
    )
    sidecar_image: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Image of the llm-d routing sidecar of the decode pods (default: the pinned release).",
    )


# The API server checks these rules against the CRD's default of spec.router ({}), where no field is set:
# every field a rule reads must be guarded with has().
_GATEWAY_API = "(has(self.type) && self.type == 'gateway-api')"


class RouterSpec(ApiModel):
    """The request router in front of both pools (OpenAI-compatible API)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    f"!has(self.port) || !(self.port in {list(ROUTER_POD_PORTS)})",
                    "spec.router.port must not be a port the router pod already uses "
                    f"({', '.join(map(str, ROUTER_POD_PORTS))})",
                    ".port",
                ),
                _rule(
                    f"{_GATEWAY_API} || !has(self.gatewayApi)",
                    GATEWAY_API_NEEDS_TYPE,
                    ".gatewayApi",
                ),
                _rule(f"!{_GATEWAY_API} || !has(self.image)", GATEWAY_API_NO_IMAGE, ".image"),
                _rule(
                    f"!{_GATEWAY_API} || !has(self.args) || size(self.args) == 0",
                    GATEWAY_API_NO_ARGS,
                    ".args",
                ),
                _rule(
                    f"!{_GATEWAY_API} || !has(self.serviceType) || self.serviceType == 'ClusterIP'",
                    GATEWAY_API_SERVICE_TYPE,
                    ".serviceType",
                ),
            ]
        }
    )

    type: RouterType = Field(
        default="builtin",
        description="builtin: the engine's own P/D router (vllm-router or sglang-router) behind the router "
        "Service. gateway-api: no built-in router; an InferencePool (inference.networking.k8s.io/v1) "
        "over both pools with the llm-d endpoint picker, for a Gateway API implementation that supports "
        "the Inference Extension (see spec.router.gatewayApi).",
    )
    gateway_api: GatewayApiSpec | None = Field(
        default=None,
        description="Settings of the gateway-api router type (only with type: gateway-api; defaults apply "
        "when unset).",
    )
    replicas: int = Field(default=1, ge=0, le=100, description="Router replicas.")
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Router image (default: the pinned release of the router that serves the engine and "
        "connector: vllm-router for vllm, sglang-router for sglang).",
    )
    args: ArgList = Field(default_factory=list, description="Extra router arguments.")
    env: EnvList = Field(default_factory=list, description="Extra router environment variables.")
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Type of the router Service."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port of the router Service and container.")
    resources: ResourceRequirements | None = Field(default=None, description="Router container resources.")
    node_selector: StringMap | None = Field(default=None, description="Node labels the router requires.")
    tolerations: TolerationList | None = Field(default=None, description="Router pod tolerations.")

    @model_validator(mode="after")
    def _type_fields(self) -> Self:
        if self.type != "gateway-api":
            if self.gateway_api is not None:
                raise ValueError(GATEWAY_API_NEEDS_TYPE)
            return self
        if self.image is not None:
            raise ValueError(GATEWAY_API_NO_IMAGE)
        if self.args:
            raise ValueError(GATEWAY_API_NO_ARGS)
        if self.service_type != "ClusterIP":
            raise ValueError(GATEWAY_API_SERVICE_TYPE)
        return self

    @property
    def gateway(self) -> bool:
        """Whether requests are routed through the Gateway API Inference Extension."""
        return self.type == "gateway-api"

    @property
    def gateway_settings(self) -> GatewayApiSpec:
        """spec.router.gatewayApi, or its defaults when unset."""
        return self.gateway_api or GatewayApiSpec()


# ------------------------------------------------------------------------------------------ autoscaling

# Most replicas spec.replicas may ask for: both pools at ReplicaBounds' 1000 each.
MAX_TOTAL_REPLICAS = 2000


class ReplicaBounds(ApiModel):
    """Replica bounds of one pool under autoscaling."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "self.minReplicas <= self.maxReplicas",
                    "minReplicas must not exceed maxReplicas",
                    ".minReplicas",
                )
            ]
        }
    )

    min_replicas: int = Field(default=1, ge=0, le=1000, description="Fewest replicas the autoscaler keeps.")
    max_replicas: int = Field(default=8, ge=0, le=1000, description="Most replicas the autoscaler allows.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must not exceed maxReplicas ({self.max_replicas})"
            )
        return self

    def clamp(self, value: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, value))


class AutoscalingSpec(ApiModel):
    """Ratio autoscaling: a RatioPolicy decides prefill and decode replicas together."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "!self.enabled || has(self.policyRef)",
                    "spec.autoscaling.policyRef is required when spec.autoscaling.enabled is true",
                    ".policyRef",
                )
            ]
        }
    )

    enabled: bool = Field(default=False, description="Whether the ratio autoscaler manages replicas.")
    policy_ref: LocalObjectReference | None = Field(
        default=None, description="The RatioPolicy (same namespace) that decides."
    )
    mode: Mode | None = Field(
        default=None,
        description="active: this deployment's decisions are applied; advisory: decided and reported, never "
        "applied. Overrides the RatioPolicy's spec.mode for this deployment only (trial a shared policy on "
        "one deployment); default: the policy's.",
    )
    prefill: ReplicaBounds | None = Field(default=None, description="Prefill replica bounds.")
    decode: ReplicaBounds | None = Field(default=None, description="Decode replica bounds.")
    max_gpus: int | None = Field(
        default=None,
        alias="maxGPUs",
        ge=1,
        le=100_000,
        description="Most GPUs both pools may use together.",
    )

    @model_validator(mode="after")
    def _policy_when_enabled(self) -> Self:
        if self.enabled and self.policy_ref is None:
            raise ValueError("spec.autoscaling.policyRef is required when spec.autoscaling.enabled is true")
        return self

    def bounds(self, role: RoleName) -> ReplicaBounds | None:
        return self.prefill if role == "prefill" else self.decode


# ------------------------------------------------------------------------------------------------- spec


def _within_bounds_rule(role: RoleName) -> dict[str, Any]:
    return _rule(
        f"!has(self.autoscaling) || !has(self.autoscaling.{role}) || "
        f"(self.{role}.replicas >= self.autoscaling.{role}.minReplicas && "
        f"self.{role}.replicas <= self.autoscaling.{role}.maxReplicas)",
        f"spec.{role}.replicas must lie within spec.autoscaling.{role}.minReplicas and maxReplicas",
        f".{role}.replicas",
    )


def _min_footprint(role: RoleName) -> str:
    return (
        f"(has(self.autoscaling.{role}) ? self.autoscaling.{role}.minReplicas : self.{role}.replicas)"
        f" * {_cel_gpus_per_replica(f'self.{role}')}"
    )


def vllm_nodes_message(role: RoleName) -> str:
    return (
        f"spec.{role}.parallelism.data must be a multiple of nodesPerReplica with vllm (each node of a "
        "replica runs data / nodesPerReplica data-parallel ranks: --data-parallel-size-local)"
    )


def sglang_nodes_message(role: RoleName) -> str:
    return (
        f"spec.{role}.parallelism: with sglang, data > 1 on several nodes needs dataParallelAttention (a "
        "multi-node SGLang replica is one tensor-parallel group over all its nodes, --attn-dp-size data)"
    )


def _engine_nodes_rules(role: RoleName) -> list[dict[str, Any]]:
    par = f"self.{role}.parallelism"
    return [
        _rule(
            f"self.engine.type != 'vllm' || !has({par}) || {par}.data % {par}.nodesPerReplica == 0",
            vllm_nodes_message(role),
            f".{role}.parallelism.data",
        ),
        _rule(
            f"self.engine.type != 'sglang' || !has({par}) || {par}.nodesPerReplica == 1 || {par}.data == 1 "
            f"|| {par}.dataParallelAttention",
            sglang_nodes_message(role),
            f".{role}.parallelism",
        ),
    ]


class DisaggregatedDeploymentSpec(ApiModel):
    """Desired state: the model, the engine, the KV connector, both pools and the router."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # One rule per refused engine x connector, generated from the support matrix.
                *support_rules(),
                _within_bounds_rule("prefill"),
                _within_bounds_rule("decode"),
                _rule(
                    "!has(self.autoscaling) || !has(self.autoscaling.maxGPUs) || "
                    f"self.autoscaling.maxGPUs >= {_min_footprint('prefill')} + {_min_footprint('decode')}",
                    "spec.autoscaling.maxGPUs is below the GPUs the minimum replicas of both pools need",
                    ".autoscaling.maxGPUs",
                ),
                *_engine_nodes_rules("prefill"),
                *_engine_nodes_rules("decode"),
                _rule(
                    "!has(self.router.type) || self.router.type != 'gateway-api' || !("
                    "(has(self.prefill.parallelism) && self.prefill.parallelism.nodesPerReplica > 1) || "
                    "(has(self.decode.parallelism) && self.decode.parallelism.nodesPerReplica > 1))",
                    GATEWAY_API_MULTI_NODE,
                    ".router.type",
                ),
            ]
        }
    )

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(description="The inference engine.")
    kv_transfer: KVTransferSpec = Field(description="How KV caches move from prefill to decode.")
    common: CommonSpec | None = Field(
        default=None,
        description="Pod settings both pools inherit (nodeSelector, tolerations, affinity, env, "
        "podTemplate); each pool may override them, field by field as CommonSpec describes.",
    )
    prefill: RoleSpec = Field(
        default_factory=RoleSpec,
        description="The prefill pool (merged over spec.common).",
        json_schema_extra={"default": {}},
    )
    decode: RoleSpec = Field(
        default_factory=RoleSpec,
        description="The decode pool (merged over spec.common).",
        json_schema_extra={"default": {}},
    )
    router: RouterSpec = Field(
        default_factory=RouterSpec,
        description="The router in front of both pools.",
        json_schema_extra={"default": {}},
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Ratio autoscaling (off unless enabled)."
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOTAL_REPLICAS,
        description="Total replicas of both pools (prefill + decode), for an external autoscaler (HPA, "
        "KEDA) through this object's /scale subresource. When set, the operator sizes the pools to sum to "
        "it at the prefill:decode ratio the RatioPolicy decided (with autoscaling enabled and active), else "
        "at spec.prefill.replicas:spec.decode.replicas; each pool stays within spec.autoscaling.<pool> and "
        "the total within spec.autoscaling.maxGPUs. 0 scales both pools to zero (KEDA's idle state); "
        "otherwise each pool keeps at least one replica. Unset: the pools' own replicas (or the "
        "RatioPolicy's decision) apply. The operator stays the only writer of the pools' replicas.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        cell = combination(self.engine.type, self.kv_transfer.connector)
        if not cell.accepted:
            raise ValueError(cell.refusal)
        kv = self.kv_transfer
        if kv.bootstrap_port == kv.side_channel_port:
            raise ValueError("spec.kvTransfer.bootstrapPort and spec.kvTransfer.sideChannelPort must differ")
        for field_name, port in (
            ("bootstrapPort", kv.bootstrap_port),
            ("sideChannelPort", kv.side_channel_port),
        ):
            if _port_taken(port):
                raise ValueError(
                    f"spec.kvTransfer.{field_name} must not be a port the engine pods use {_TAKEN}"
                )
        for role in ROLE_NAMES:
            spec = self.role(role)
            if spec.parallelism is None:
                continue
            if self.engine.type == "vllm" and spec.data_size % spec.nodes_per_replica:
                raise ValueError(
                    f"{vllm_nodes_message(role)}: data {spec.data_size}, {spec.nodes_per_replica} nodes"
                )
            if (
                self.engine.type == "sglang"
                and spec.multi_node
                and spec.data_size > 1
                and not spec.data_parallel_attention
            ):
                raise ValueError(sglang_nodes_message(role))
        if self.router.gateway and any(self.role(role).multi_node for role in ROLE_NAMES):
            raise ValueError(GATEWAY_API_MULTI_NODE)
        if self.router.port in ROUTER_POD_PORTS:
            raise ValueError(
                "spec.router.port must not be a port the router pod already uses "
                f"({', '.join(map(str, ROUTER_POD_PORTS))})"
            )
        if self.autoscaling is None:
            return self
        for role in ROLE_NAMES:
            bounds = self.autoscaling.bounds(role)
            replicas = self.role(role).replicas
            if bounds is not None and not bounds.min_replicas <= replicas <= bounds.max_replicas:
                raise ValueError(
                    f"spec.{role}.replicas ({replicas}) must lie within spec.autoscaling.{role}.minReplicas "
                    f"({bounds.min_replicas}) and maxReplicas ({bounds.max_replicas})"
                )
        if self.autoscaling.max_gpus is not None:
            need = sum(self.min_replicas(role) * self.role(role).gpus_per_replica for role in ROLE_NAMES)
            if self.autoscaling.max_gpus < need:
                raise ValueError(
                    f"spec.autoscaling.maxGPUs ({self.autoscaling.max_gpus}) is below the {need} GPUs the "
                    "minimum replicas of both pools need"
                )
        return self

    def role(self, role: RoleName) -> RoleSpec:
        """The effective spec of pool ``role``: spec.prefill or spec.decode with spec.common merged in
        (:meth:`CommonSpec.under`). Every consumer reads a pool through this (the renderer, the
        autoscaler's bounds, the twin), so none sees common's settings differently; the fields as written
        are spec.prefill and spec.decode. Without spec.common it is the pool's own object."""
        own = self.prefill if role == "prefill" else self.decode
        return own if self.common is None else self.common.under(own)

    def min_replicas(self, role: RoleName) -> int:
        return self.replica_bounds(role).min_replicas

    def replica_bounds(self, role: RoleName) -> ReplicaBounds:
        """The replicas autoscaling may give ``role``: spec.autoscaling.<role>, or when that is unset the
        spec's replicas alone (at least one as the most, so a pool at 0 may be started)."""
        bounds = self.autoscaling.bounds(role) if self.autoscaling else None
        if bounds is not None:
            return bounds
        replicas = self.role(role).replicas
        return ReplicaBounds(min_replicas=replicas, max_replicas=max(replicas, 1))


# ----------------------------------------------------------------------------------------------- object


def _cel_multi_node(role: RoleName) -> str:
    par = f"self.spec.{role}.parallelism"
    return f"(has({par}) && {par}.nodesPerReplica > 1)"


class DisaggregatedDeployment(ApiModel):
    """A model served with prefill and decode disaggregated: a prefill pool, a decode pool and a router."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    f"self.metadata.name.size() <= {MAX_DD_NAME_LENGTH}",
                    f"metadata.name must be at most {MAX_DD_NAME_LENGTH} characters (child names append "
                    "-prefill-headless and must fit in 63)",
                ),
                _rule(
                    f"!({_cel_multi_node('prefill')} || {_cel_multi_node('decode')})"
                    f" || self.metadata.name.size() <= {MAX_MULTI_NODE_DD_NAME_LENGTH}",
                    MULTI_NODE_NAME_TOO_LONG,
                ),
                _rule(
                    f"self.metadata.name.matches('{DNS1035_LABEL}')",
                    "metadata.name must be a DNS-1035 label (lower case letters, digits and '-', starting "
                    "with a letter) because Services are named after it",
                ),
            ]
        }
    )

    api_version: Literal["disagg.dev/v1alpha1"] = Field(
        default="disagg.dev/v1alpha1", alias="apiVersion", description="disagg.dev/v1alpha1."
    )
    kind: Literal["DisaggregatedDeployment"] = Field(
        default="DisaggregatedDeployment", description="DisaggregatedDeployment."
    )
    metadata: FreeFormObject = Field(default_factory=dict, description="Standard object metadata.")
    spec: DisaggregatedDeploymentSpec = Field(description="Desired state.")
    status: DisaggregatedDeploymentStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _name(self) -> Self:
        name = self.metadata.get("name")
        if name is None:
            return self
        if not isinstance(name, str) or len(name) > MAX_DD_NAME_LENGTH:
            raise ValueError(
                f"metadata.name must be at most {MAX_DD_NAME_LENGTH} characters (child names append "
                "-prefill-headless and must fit in 63)"
            )
        multi_node = any(self.spec.role(role).multi_node for role in ROLE_NAMES)
        if multi_node and len(name) > MAX_MULTI_NODE_DD_NAME_LENGTH:
            raise ValueError(MULTI_NODE_NAME_TOO_LONG)
        if not re.match(DNS1035_LABEL, name):
            raise ValueError(
                f"metadata.name {name!r} must be a DNS-1035 label (lower case letters, digits and '-', "
                "starting with a letter) because Services are named after it"
            )
        return self

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")


__all__ = [
    "FREE_FORM_OBJECT",
    "MAX_DECISION_MESSAGE",
    "MAX_STATUS_DECISIONS",
    "ROLE_NAMES",
    "AutoscalingSpec",
    "AutoscalingStatus",
    "CommonSpec",
    "Connector",
    "DesiredReplicas",
    "DisaggregatedDeployment",
    "DisaggregatedDeploymentSpec",
    "DisaggregatedDeploymentStatus",
    "EndpointPickerSpec",
    "Engine",
    "EngineSpec",
    "GatewayApiSpec",
    "GatewayParentRef",
    "KVTransferSpec",
    "ModelCacheCreate",
    "ModelCacheSpec",
    "ModelSource",
    "ModelSpec",
    "Parallelism",
    "RdmaSpec",
    "ReplicaBounds",
    "RoleName",
    "RoleSpec",
    "RoleStatus",
    "RouterSpec",
    "RouterStatus",
    "RouterType",
    "ScalingDecision",
    "format_ratio",
]
