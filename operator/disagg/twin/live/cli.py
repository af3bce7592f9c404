"""``disagg twin``: the live twin.

``disagg twin serve`` runs emulated engines, one HTTP endpoint per simulated pod on 127.0.0.1: either a
fixed layout (``--prefill N --decode M``) or following the pods of a DisaggregatedDeployment on a
cluster (``--kubeconfig K --namespace NS --deployment NAME``). ``--proxy-port`` adds the built-in toy
P/D proxy; ``--load-trace``/``--load-rate`` drive load through it. ``disagg twin load`` sends bounded
load to an endpoint that is already running. ``disagg twin calibrate`` (:mod:`disagg.twin.cli_calibrate`)
fits a latency profile to a user's own benchmark runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from disagg.clicommon import EPILOG, EXIT_FAILURE, EXIT_OK, EXIT_USAGE, is_stdout
from disagg.twin.live.engine import EngineSettings
from disagg.twin.live.exposition import ENGINE_KINDS
from disagg.twin.live.latency import LatencyChoice
from disagg.twin.live.load import LoadRequest, LoadSettings, poisson_requests, run_load, trace_requests
from disagg.twin.live.pods import PodPool, PodSpec, PoolSettings
from disagg.twin.live.proxy import HANDSHAKES, Handshake, ToyPDProxy
from disagg.twin.live.server import ServerSettings

log = logging.getLogger("disagg.twin")

ENDPOINTS_FILE_REFRESH_S = 0.2  # how often the endpoints file is compared with the pool and rewritten
READY_POLL_S = 0.2  # how often --load-* waits for the proxy to have a prefill and a decode pod


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="twin_command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="run emulated engines (fixed layout, or following a cluster)")
    _serve_arguments(serve)
    serve.set_defaults(func=serve_command)
    load = sub.add_parser("load", help="send bounded load to a twin endpoint, router or proxy")
    load.add_argument("--target", required=True, help="base URL, http://127.0.0.1:PORT")
    _load_arguments(load, prefix="")
    load.set_defaults(func=load_command)
    from disagg.twin import cli_calibrate  # pure: fits a profile, no engine

    calibrate = sub.add_parser(
        "calibrate",
        help="fit a latency profile to your own benchmark runs (vLLM, AIPerf/GenAI-Perf, CSV)",
        description=cli_calibrate.DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli_calibrate.configure(calibrate)


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    follow = p.add_argument_group("following a cluster")
    follow.add_argument("--kubeconfig", type=Path, help="kubeconfig of the cluster to follow")
    follow.add_argument("--namespace", default="default")
    follow.add_argument("--deployment", help="DisaggregatedDeployment whose pods to follow")
    fixed = p.add_argument_group("fixed layout (no cluster)")
    fixed.add_argument("--prefill", type=int, default=1, help="prefill pods (default 1)")
    fixed.add_argument("--decode", type=int, default=1, help="decode pods (default 1)")
    fixed.add_argument("--colocated", type=int, default=0, help="colocated pods (default 0)")
    model = p.add_argument_group("latency model (overrides what the cluster says)")
    model.add_argument("--model", help="model name or Hugging Face id (default llama-3.1-8b)")
    model.add_argument("--gpu", help="GPU type, e.g. h100, l40s (default: pod nodeSelector, else h100)")
    model.add_argument("--tp", type=int, help="tensor-parallel size (default: pod GPU limit, else 1)")
    model.add_argument("--dtype", help="bf16 or fp8")
    model.add_argument(
        "--engine", choices=ENGINE_KINDS, help="metrics flavour (default: the DD's engine, vllm)"
    )
    engine = p.add_argument_group("engine")
    engine.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per engine second")
    engine.add_argument(
        "--startup-delay",
        type=float,
        help="model loading time of every new pod, engine seconds (default: following a "
        "DisaggregatedDeployment, its spec's start-up estimate, cached or downloading, times "
        "--startup-scale; else 0)",
    )
    engine.add_argument(
        "--startup-scale",
        type=float,
        default=1.0,
        help="factor on the spec's start-up estimate, to compress model loading (default 1)",
    )
    engine.add_argument("--max-num-seqs", type=int, default=EngineSettings.max_num_seqs)
    engine.add_argument("--max-num-batched-tokens", type=int, default=EngineSettings.max_num_batched_tokens)
    engine.add_argument("--kv-link", default=EngineSettings.kv_link, help="nic or nvlink")
    run = p.add_argument_group("run")
    run.add_argument("--proxy-port", type=int, help="also run the toy P/D proxy on this port (0: any)")
    run.add_argument(
        "--handshake",
        choices=HANDSHAKES,
        help="the proxy's P/D pairing: vLLM's NIXL kv_transfer_params or SGLang's bootstrap room "
        "(default: bootstrap when the prefill pods play SGLang, else nixl)",
    )
    run.add_argument(
        "--endpoints-file",
        type=Path,
        help="keep a JSON map of pods to endpoints here; - prints it to stdout, one line per change",
    )
    run.add_argument("--duration", type=float, help="stop after this many wall seconds")
    _load_arguments(run, prefix="load-")


def _load_arguments(p: Any, prefix: str) -> None:
    p.add_argument(f"--{prefix}trace", type=Path, help="trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV)")
    p.add_argument(f"--{prefix}rate", type=float, help="Poisson arrival rate, requests per engine second")
    p.add_argument(f"--{prefix}requests", type=int, default=100, help="most requests to send")
    p.add_argument(f"--{prefix}duration", type=float, default=60.0, help="most wall seconds of load")
    p.add_argument(f"--{prefix}prompt-tokens", type=int, default=1024, help="prompt length with --rate")
    p.add_argument(f"--{prefix}output-tokens", type=int, default=128, help="output length with --rate")
    p.add_argument(f"--{prefix}seed", type=int, default=0)
    if prefix == "":
        p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per engine second")


def _requests(args: argparse.Namespace, prefix: str) -> list[LoadRequest] | None:
    def get(name: str) -> Any:
        return getattr(args, (prefix + name).replace("-", "_"))

    if get("trace") is not None:
        return trace_requests(get("trace"), get("requests"))
    if get("rate") is not None:
        return poisson_requests(
            get("rate"), get("requests"), get("prompt-tokens"), get("output-tokens"), get("seed")
        )
    return None


def _pool_settings(args: argparse.Namespace) -> PoolSettings:
    return PoolSettings(
        engine=EngineSettings(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            time_scale=args.time_scale,
            kv_link=args.kv_link,
        ),
        server=ServerSettings(),
        startup_delay_s=args.startup_delay if args.startup_delay is not None else 0.0,
    )


def fixed_layout(args: argparse.Namespace) -> dict[str, PodSpec]:
    choice = LatencyChoice(
        args.model or "llama-3.1-8b", args.gpu or "h100", args.tp or 1, args.dtype or "bf16"
    )
    engine = args.engine or "vllm"
    specs: dict[str, PodSpec] = {}
    for role, count in (("prefill", args.prefill), ("decode", args.decode), ("colocated", args.colocated)):
        if count < 0:
            raise ValueError(f"--{role} must be >= 0, got {count}")
        for i in range(count):
            name = f"twin-{role}-{i}"
            specs[name] = PodSpec(name, role, choice, engine)  # type: ignore[arg-type]
    return specs


def _endpoints_document(pool: PodPool, proxy_url: str | None) -> dict[str, Any]:
    pods = {
        name: {
            "role": pod.spec.role,
            "state": pod.state,
            "endpoint": pod.server.endpoint if pod.server else None,
        }
        for name, pod in sorted(pool.pods.items())
    }
    return {"pods": pods, "proxy": proxy_url}


async def _keep_endpoints_file(path: Path, pool: PodPool, proxy_url: str | None) -> None:
    last = ""
    while True:
        document = _endpoints_document(pool, proxy_url)
        if is_stdout(path):  # JSON lines: one whole document per change
            text = json.dumps(document, sort_keys=True)
            if text != last:
                print(text, flush=True)
                last = text
            await asyncio.sleep(ENDPOINTS_FILE_REFRESH_S)
            continue
        text = json.dumps(document, indent=2, sort_keys=True)
        if text != last:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            last = text
        await asyncio.sleep(ENDPOINTS_FILE_REFRESH_S)


def pool_handshake(pool: PodPool) -> Handshake:
    """SGLang's bootstrap pairing when the serving prefill pods play SGLang, else vLLM's NIXL handshake."""
    engines = {p.spec.engine for p in pool.pods.values() if p.spec.role == "prefill" and p.state == "serving"}
    return "bootstrap" if engines == {"sglang"} else "nixl"


async def serve(args: argparse.Namespace, requests: list[LoadRequest] | None = None) -> int:
    from disagg.twin.live.follower import Overrides, PodFollower

    pool = PodPool(_pool_settings(args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    follower = None
    api_client = None
    if args.deployment:
        from kubernetes import config

        new_client: Any = config.new_client_from_config
        api_client = new_client(config_file=str(args.kubeconfig) if args.kubeconfig else None)
        overrides = Overrides(args.model, args.gpu, args.tp, args.dtype, args.engine, args.startup_delay)
        follower = PodFollower(
            api_client, args.namespace, args.deployment, pool, overrides, startup_scale=args.startup_scale
        )
        follower.start()
    else:
        await pool.reconcile(fixed_layout(args))
    proxy = None
    if args.proxy_port is not None:
        handshake: Handshake | Callable[[], Handshake] = args.handshake or (lambda: pool_handshake(pool))
        proxy = ToyPDProxy(
            lambda: pool.endpoints("prefill"),
            lambda: pool.endpoints("decode"),
            ServerSettings(port=args.proxy_port),
            handshake=handshake,
            bootstrap_port=pool.side_channel_port,
        )
        await proxy.start()
        print(f"toy P/D proxy on {proxy.url}", flush=True)
    background: list[asyncio.Task[Any]] = []
    if args.endpoints_file is not None:
        background.append(
            loop.create_task(_keep_endpoints_file(args.endpoints_file, pool, proxy.url if proxy else None))
        )
    if args.duration is not None:
        background.append(loop.create_task(_stop_after(args.duration, stop)))
    if requests is not None:
        if proxy is None:
            raise ValueError("--load-trace/--load-rate need --proxy-port (load goes through the toy proxy)")
        background.append(loop.create_task(_load_then_report(proxy.url, requests, args, stop)))
    try:
        await stop.wait()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if follower is not None:
            await follower.stop()
        if proxy is not None:
            await proxy.stop()
        await pool.close()
        if api_client is not None:
            api_client.close()
    return 0


async def _stop_after(seconds: float, stop: asyncio.Event) -> None:
    await asyncio.sleep(seconds)
    stop.set()


async def _load_then_report(
    url: str, requests: list[LoadRequest], args: argparse.Namespace, stop: asyncio.Event
) -> None:
    await _wait_ready(url, args.load_duration)
    settings = LoadSettings(url, args.load_requests, args.load_duration, args.time_scale)
    report = await run_load(requests, settings)
    print(report.summary(), flush=True)


async def _wait_ready(url: str, timeout_s: float) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            with suppress(aiohttp.ClientError):
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(READY_POLL_S)


def _read_requests(args: argparse.Namespace, prefix: str, prog: str) -> list[LoadRequest] | None:
    """The load the flags ask for; a trace that cannot be read or holds no request is a failure (exit 1),
    a bad --rate or count a usage error (exit 2): both exit here, naming the problem."""
    try:
        return _requests(args, prefix)
    except (ValueError, OSError) as err:
        trace = getattr(args, f"{prefix}trace")
        print(f"{prog}: {err}", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE if trace is not None else EXIT_USAGE) from err


def serve_command(args: argparse.Namespace) -> int:
    requests = _read_requests(args, "load_", "disagg twin serve")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        return asyncio.run(serve(args, requests))
    except ValueError as err:  # the layout or flags the serve command was given
        print(f"disagg twin serve: {err}", file=sys.stderr)
        return EXIT_USAGE


def load_command(args: argparse.Namespace) -> int:
    requests = _read_requests(args, "", "disagg twin load")
    try:
        if requests is None:
            raise ValueError("give --trace or --rate")
        settings = LoadSettings(args.target, args.requests, args.duration, args.time_scale)
    except ValueError as err:
        print(f"disagg twin load: {err}", file=sys.stderr)
        return EXIT_USAGE
    report = asyncio.run(run_load(requests, settings))
    print(report.summary())
    return EXIT_OK if report.failed == 0 else EXIT_FAILURE
