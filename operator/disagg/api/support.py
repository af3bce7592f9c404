"""The support matrix: which engine x KV connector combinations the API accepts, and which router serves each.

The single table both layers read: the API (CEL rules in the CRD and the pydantic validator, both
generated from :data:`SUPPORT_MATRIX`) refuses every combination that is not accepted with a message
naming why, and the renderer (``disagg.render.engines`` / ``disagg.render.connectors``, one module per
engine and per connector) asks it which router to deploy. The table lives here, not in render/, because
api/ must not import render/; render/ may import api/. docs/deployment.md's support-matrix section is
generated from it too (``disagg crds`` rewrites it; a unit test fails when it is stale).

A combination is accepted only when the released router it names speaks that connector's P/D protocol
with Kubernetes service discovery, checked against the released code at the pinned versions (the
``source`` of each row). Pure: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

Engine = Literal["vllm", "sglang"]
Connector = Literal["nixl", "mooncake", "lmcache", "p2p-nccl"]
RouterName = Literal["vllm-router", "sglang-router"]

ENGINES: tuple[Engine, ...] = get_args(Engine)
CONNECTORS: tuple[Connector, ...] = get_args(Connector)

# Versions the rows were checked against (the default images' tags, disagg.render.settings).
ROUTER_VERSIONS = MappingProxyType({"vllm-router": "0.1.17", "sglang-router": "0.3.2"})
ENGINE_LABELS = MappingProxyType({"vllm": "vLLM 0.33.0", "sglang": "SGLang 0.5.23"})


@dataclass(frozen=True)
class Combination:
    """One engine x connector cell: the router that serves it, or why the API refuses it."""

    engine: Engine
    connector: Connector
    router: RouterName | None  # None: refused
    reason: str  # accepted: how P/D works; refused: why not (shown to the user)
    source: str  # where the facts come from (released wheel or repository file)

    @property
    def accepted(self) -> bool:
        return self.router is not None

    @property
    def refusal(self) -> str:
        """The message the API returns for a refused combination (names the field)."""
        return f"spec.kvTransfer.connector: {self.connector} with {self.engine}: {self.reason}"


SUPPORT_MATRIX: tuple[Combination, ...] = (
    Combination(
        "vllm",
        "nixl",
        "vllm-router",
        "vllm-router --vllm-pd-disaggregation --kv-connector nixl sends the prefill request with "
        "kv_transfer_params {do_remote_decode: true} and forwards the prefill response's "
        "kv_transfer_params to decode, for pods found by Kubernetes discovery too",
        "vllm-project/router src/routers/http/vllm_pd_router.rs build_decode_kv_transfer_params "
        "(KvConnector::Nixl); vllm 0.33.0 wheel vllm/distributed/kv_transfer/kv_connector/factory.py "
        "registers NixlConnector",
    ),
    Combination(
        "vllm",
        "mooncake",
        None,
        "vllm-router 0.1.17 queries Mooncake bootstrap servers only for static --prefill URLs, so pods "
        "found by Kubernetes service discovery get no transfer parameters and decode recomputes; use nixl",
        "vllm-project/router src/routers/http/vllm_pd_router.rs VllmPDRouter::new (mooncake_prefill_info "
        "filled from prefill_urls only) and get_mooncake_info; strings of vllm_router_rs.abi3.so 0.1.17 "
        "('No Mooncake bootstrap info for prefill')",
    ),
    Combination(
        "vllm",
        "lmcache",
        None,
        "no released router injects LMCache's disagg_spec, without which the prefill side sends no KV "
        "(LMCache's proxy is an example script); use nixl",
        "lmcache 0.5.6 wheel lmcache/integration/vllm/vllm_v1_adapter.py (disagg_spec); "
        "'disagg_spec' appears in neither vllm_router_rs.abi3.so 0.1.17 nor sglang_router_rs.abi3.so 0.3.2",
    ),
    Combination(
        "vllm",
        "p2p-nccl",
        None,
        "vLLM 0.33.0 no longer ships P2pNcclConnector (and vllm-router delivers its addresses only through "
        "--vllm-discovery-address registrations, one router replica each); use nixl",
        "vllm 0.33.0 wheel vllm/distributed/kv_transfer/kv_connector/factory.py (no P2pNcclConnector "
        "registered); vllm-project/router src/routers/http/vllm_pd_router.rs get_zmq_address",
    ),
    Combination(
        "sglang",
        "mooncake",
        "sglang-router",
        "sglang_router --pd-disaggregation --service-discovery reads each prefill pod's bootstrap port "
        "from the sglang.ai/bootstrap-port annotation and sends bootstrap_host/port/room to both pools",
        "sglang_router 0.3.2 wheel sglang_router/router_args.py (bootstrap_port_annotation); sglang 0.5.23 "
        "wheel sglang/srt/arg_groups/choices.py DISAGG_TRANSFER_BACKEND_CHOICES",
    ),
    Combination(
        "sglang",
        "nixl",
        "sglang-router",
        "the same SGLang bootstrap protocol as mooncake; only the transfer backend differs",
        "sglang 0.5.23 wheel sglang/srt/arg_groups/choices.py DISAGG_TRANSFER_BACKEND_CHOICES",
    ),
    Combination(
        "sglang",
        "lmcache",
        None,
        "SGLang has no lmcache transfer backend (--disaggregation-transfer-backend: mooncake, nixl, ...); "
        "use mooncake or nixl",
        "sglang 0.5.23 wheel sglang/srt/arg_groups/choices.py DISAGG_TRANSFER_BACKEND_CHOICES",
    ),
    Combination(
        "sglang",
        "p2p-nccl",
        None,
        "SGLang has no p2p-nccl transfer backend (--disaggregation-transfer-backend: mooncake, nixl, ...); "
        "use mooncake or nixl",
        "sglang 0.5.23 wheel sglang/srt/arg_groups/choices.py DISAGG_TRANSFER_BACKEND_CHOICES",
    ),
)


def combination(engine: str, connector: str) -> Combination:
    """The matrix cell of one engine and connector (both must be enum values)."""
    for cell in SUPPORT_MATRIX:
        if cell.engine == engine and cell.connector == connector:
            return cell
    raise KeyError(f"no support-matrix entry for {engine} x {connector}")


def accepted_connectors(engine: str) -> tuple[Connector, ...]:
    return tuple(cell.connector for cell in SUPPORT_MATRIX if cell.engine == engine and cell.accepted)


def router_for(engine: str, connector: str) -> RouterName:
    """The router that serves an accepted combination."""
    cell = combination(engine, connector)
    if cell.router is None:
        raise ValueError(cell.refusal)
    return cell.router


def support_rules() -> list[dict[str, Any]]:
    """CEL rules (on the spec) refusing each refused combination, each with its reason."""
    return [
        {
            "rule": f"!(self.engine.type == '{cell.engine}' && "
            f"self.kvTransfer.connector == '{cell.connector}')",
            "message": cell.refusal,
            "fieldPath": ".kvTransfer.connector",
        }
        for cell in SUPPORT_MATRIX
        if not cell.accepted
    ]


def support_matrix_markdown() -> str:
    """The support-matrix table of docs/deployment.md (generated; ``disagg crds`` rewrites it)."""
    lines = [
        "| engine | connector | router | accepted | why | source |",
        "|---|---|---|---|---|---|",
    ]
    for cell in SUPPORT_MATRIX:
        router = f"{cell.router} {ROUTER_VERSIONS[cell.router]}" if cell.router else "none"
        verdict = "yes" if cell.accepted else "**refused**"
        lines.append(
            f"| {ENGINE_LABELS[cell.engine]} | `{cell.connector}` | {router} | {verdict} | {cell.reason} "
            f"| {cell.source} |"
        )
    return "\n".join(lines) + "\n"


MATRIX_BEGIN = "<!-- support-matrix: generated by `disagg crds` from disagg.api.support; do not edit -->"
MATRIX_END = "<!-- end of support-matrix -->"


def with_support_matrix(text: str) -> str:
    """``text`` (docs/deployment.md) with the block between the markers replaced by the current matrix."""
    start, end = text.find(MATRIX_BEGIN), text.find(MATRIX_END)
    if start < 0 or end < start:
        raise ValueError(f"no {MATRIX_BEGIN!r} ... {MATRIX_END!r} block to fill")
    head = text[: start + len(MATRIX_BEGIN)]
    return f"{head}\n{support_matrix_markdown()}{text[end:]}"


__all__ = [
    "CONNECTORS",
    "ENGINES",
    "SUPPORT_MATRIX",
    "Combination",
    "Connector",
    "Engine",
    "RouterName",
    "accepted_connectors",
    "combination",
    "router_for",
    "support_matrix_markdown",
    "support_rules",
    "with_support_matrix",
]
