"""What rendering needs besides the spec: default images, well-known ports, probe timing.

One frozen :class:`RenderSettings`; :data:`DEFAULT_SETTINGS` is what ``render_children`` uses unless
told otherwise. Every number that is a fact about an engine carries its source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderSettings:
    # --- images (spec.engine.image / spec.router.image override them) ---------------------------------
    # vLLM >= 0.18 drains in-flight requests on SIGTERM for --shutdown-timeout seconds (issue 2, vLLM
    # serve docs); pin the first release with that behaviour.
    vllm_image: str = "vllm/vllm-openai:v0.18.0"
    # The SGLang image ships both the server (sglang.launch_server) and the router (sglang_router).
    sglang_image: str = "lmsysorg/sglang:v0.5.8.post1"
    # vLLM's own PD-aware router (github.com/vllm-project/router, a fork of the SGLang router with the
    # same service-discovery flags and a --vllm-pd-disaggregation mode). Swappable via spec.router.image.
    vllm_router_image: str = "ghcr.io/vllm-project/router:latest"

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
