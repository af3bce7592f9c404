"""What rendering needs besides the spec: default images, well-known ports, probe timing.

One frozen :class:`RenderSettings`; :data:`DEFAULT_SETTINGS` is what ``render_children`` uses unless
told otherwise. Every number that is a fact about an engine carries its source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    """One HTTP probe: the path and how long the kubelet waits for an answer."""

    path: str
    timeout_seconds: int


@dataclass(frozen=True)
class EngineProbes:
    """An engine's startup, readiness and liveness probes."""

    startup: Probe
    readiness: Probe
    liveness: Probe


@dataclass(frozen=True)
class RouterProbes:
    """A router's readiness and liveness probes."""

    readiness: Probe
    liveness: Probe


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
    router_metrics_port: int = 29000  # sglang_router --prometheus-port default
    # Multi-node replicas (LeaderWorkerSet groups): vLLM's data-parallel coordinator on the leader, at its
    # --data-parallel-rpc-port default (vllm 0.33.0 wheel, vllm/config/parallel.py data_parallel_rpc_port);
    # SGLang's torch.distributed rendezvous on the leader (--dist-init-addr HOST:PORT), which also takes
    # the next seven ports for its inter-node ZMQ sockets (sglang 0.5.23 wheel, sglang/srt/server_args.py
    # PortArgs: port_base = dist_init_port + 1, NUM_DERIVED_PORTS = 6).
    vllm_data_parallel_rpc_port: int = 29550
    sglang_dist_init_port: int = 20000

    # --- probes (per engine) -------------------------------------------------------------------------
    # vLLM: GET /health awaits engine_client.check_health(), a check of the engine-core's state that
    # answers at once (200, or 503 once the engine is dead) (vllm 0.33.0 wheel,
    # vllm/entrypoints/serve/instrumentator/health.py). A busy API server can still be slow: 5 s.
    vllm_probes: EngineProbes = EngineProbes(
        startup=Probe("/health", 5), readiness=Probe("/health", 5), liveness=Probe("/health", 10)
    )
    # SGLang: GET /health runs a one-token generation and polls for its answer every second, sleeping 1 s
    # before the first look, for up to SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s) before a 503 (sglang
    # 0.5.23 wheel, sglang/srt/entrypoints/http_server.py health_generate, HEALTH_CHECK_TIMEOUT): a probe
    # on it needs more than 20 s. GET /ready is a flag check (not paused, warm-up done, not shutting
    # down; same file, ready() -> tokenizer_manager.is_ready()), the right signal for readiness every
    # 5 s; startup and liveness use /health so a wedged scheduler is caught.
    sglang_probes: EngineProbes = EngineProbes(
        startup=Probe("/health", 25), readiness=Probe("/ready", 5), liveness=Probe("/health", 25)
    )
    # Routers: both serve /liveness (the process answers, whatever the workers do) and /readiness
    # (workers are available): strings of vllm_router_rs.abi3.so 0.1.17 and sglang_router_rs.abi3.so
    # 0.3.2 in their wheels. /health is not used: it can fail when one engine is unhealthy, which must
    # not restart every router at once.
    router_probes: RouterProbes = RouterProbes(
        readiness=Probe("/readiness", 5), liveness=Probe("/liveness", 5)
    )

    # --- pods ----------------------------------------------------------------------------------------
    # /dev/shm: NCCL and the engines' worker IPC use it; a container's default is 64Mi. vLLM's docs run
    # its image with --ipc=host or a large --shm-size (docs.vllm.ai "Using Docker"); SGLang's run theirs
    # with --shm-size 32g (docs.sglang.ai "Install SGLang", Docker).
    vllm_shm_size: str = "16Gi"
    sglang_shm_size: str = "32Gi"
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

    # --- model cache download Job (spec.model.cache) ---------------------------------------------------
    # Retries of the download pod before the Job is Failed (batch/v1 JobSpec.backoffLimit; its default is
    # 6): a transient Hub error is retried, a wrong id or a missing token fails within a few minutes.
    model_download_backoff_limit: int = 4
    # A download that runs longer than this fails the Job (DeadlineExceeded) instead of holding the pools
    # at 0 forever: 140 GB at a sustained 50 MB/s is under 50 minutes; 6 h leaves room for slower links.
    model_download_deadline_seconds: int = 6 * 3600
    model_download_cpu_request: str = "1"
    model_download_memory_request: str = "2Gi"


DEFAULT_SETTINGS = RenderSettings()
