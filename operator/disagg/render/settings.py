"""What rendering needs besides the spec: default images, well-known ports, probe timing.

One frozen :class:`RenderSettings`; :data:`DEFAULT_SETTINGS` is what ``render_children`` uses unless
told otherwise. Every number that is a fact about an engine carries its source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderSettings:
    # --- images (spec.engine.image / spec.router.image override them) ---------------------------------
    # Pinned to current releases, never `latest`; the tag is the PyPI version the conformance test reads
    # (disagg.cluster.released.pinned_releases). docs/images.md lists each image and what verified it.
    vllm_image: str = "vllm/vllm-openai:v0.33.0"
    sglang_image: str = "lmsysorg/sglang:v0.5.23"
    # vLLM's PD-aware router (github.com/vllm-project/router, PyPI vllm-router).
    vllm_router_image: str = "vllm/vllm-router:v0.1.17"
    # SGLang's router (PyPI sglang-router; python -m sglang_router.launch_router).
    sglang_router_image: str = "lmsysorg/sglang-router:v0.3.2"

    # --- engine ports --------------------------------------------------------------------------------
    vllm_port: int = 8000  # `vllm serve --port` default (vLLM CLI docs)
    sglang_port: int = 30000  # `sglang.launch_server --port` default (sglang server_args.py)
    # LMCache PD: the sender notifies the proxy at pd_proxy_port; the receiver listens on one init and
    # one alloc port per TP rank (LMCache docs, "Disaggregated prefill" configuration table).
    lmcache_proxy_port: int = 7500
    lmcache_peer_init_port: int = 7300
    lmcache_peer_alloc_port: int = 7400
    lmcache_buffer_bytes: int = 2 * 1024**3
    # P2pNcclConnector: each instance's NCCL port (kv_port) and the proxy's ZMQ registration port
    # (vLLM examples/online_serving/disaggregated_serving_p2p_nccl_xpyd).
    p2p_kv_port: int = 21001
    p2p_proxy_port: int = 30001
    p2p_buffer_bytes: int = 8 * 1024**3
    router_metrics_port: int = 29000  # sglang_router --prometheus-port default

    # --- pods ----------------------------------------------------------------------------------------
    shm_size: str = "16Gi"  # NCCL and engine worker IPC use /dev/shm; the container default is 64Mi.
    model_mount_path: str = "/models"
    startup_period_seconds: int = 10
    readiness_period_seconds: int = 5
    readiness_failure_threshold: int = 3
    liveness_period_seconds: int = 15
    liveness_failure_threshold: int = 8  # a busy engine can answer /health slowly; don't kill it early
    grace_margin_seconds: int = 10  # terminationGracePeriodSeconds = preStop + shutdown timeout + this
    progress_margin_seconds: int = 600  # Deployment progressDeadline = startup timeout + this
    router_cpu_request: str = "1"
    router_memory_request: str = "1Gi"


DEFAULT_SETTINGS = RenderSettings()
