"""The chaos cases: something is done to the running system, then what was lost is measured.

Each case takes a :class:`~disagg.chaos.harness.ChaosCluster` and its settings and returns a
:class:`~disagg.chaos.harness.CaseResult`: the figures (printed by the tests and by bench/chaos_report.py)
and the correctness problems found (asserted by the tests). Speeds are figures with a target, never
asserted on. Every case works in a namespace of its own and stops its operators when done.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import copy
import itertools
import json
import math
import os
import random
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from disagg.api.common import parse_rfc3339, shorten
from disagg.api.status import AutoscalingStatus
from disagg.chaos import hostile
from disagg.chaos.harness import (
    FIELD_MANAGER,
    RESYNC_INTERVAL_S,
    CaseResult,
    ChaosCluster,
    Figure,
    OperatorRun,
    Survey,
    apply_deployment,
    survey,
    tracebacks,
)
from disagg.chaos.latency import P99_TARGET_MS, ChildWatch, LatencyRun, settle, time_apply, wait_deleted
from disagg.chaos.promproxy import Fault, PrometheusProxy
from disagg.cluster.local import free_ports
from disagg.cluster.prometheus import PrometheusProcess, PrometheusSettings, start_prometheus
from disagg.cluster.wait import WaitTimeout, wait_for
from disagg.demo.harness import ClosedLoop, RunSettings, apply_object, wait_until
from disagg.demo.scenario import (
    DemoSettings,
    Phase,
    deployment_manifest,
    ratio_policy_manifest,
    tiny_deployment_manifest,
)
from disagg.demo.traffic import PhaseReport, run_traffic
from disagg.k8s.apply import DEPLOYMENT_LABEL, api_message
from disagg.k8s.client import (
    CHILD_KINDS,
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    EVENT,
    KOPF_PEERING,
    LEADERWORKERSET,
    MERGE_PATCH,
    POD,
    RATIO_POLICY,
    JsonDict,
    Kind,
    KubeApi,
)
from disagg.twin.live.load import LoadReport

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "vllm-nixl.yaml"
N = TypeVar("N", int, float)  # a counter reading: the API server's (float) or Events' counts (int)


def example_deployment(namespace: str, name: str, example: Path = EXAMPLE) -> JsonDict:
    """The example's DisaggregatedDeployment under another name, with a model cache claim of that name and
    without its autoscaling (its RatioPolicy is not installed: the case is about the children)."""
    doc = next(
        d for d in yaml.safe_load_all(example.read_text()) if d and d["kind"] == "DisaggregatedDeployment"
    )
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].pop("autoscaling", None)
    cache = doc["spec"]["model"].get("cache")
    if cache:  # a claim of its own: deployments sharing a created claim would fight over its ownership
        cache["claimName"] = f"{name}-weights"
    return dict(doc)


def small_deployment(namespace: str, name: str, gpu_type: str = "l40s") -> JsonDict:
    """A vLLM + NIXL deployment of one-GPU replicas (1 prefill, 1 decode) that kwok runs at once."""
    pool = {"replicas": 1, "nodeSelector": {"disagg.dev/gpu-type": gpu_type}}
    return tiny_deployment_manifest(name, namespace, prefill=dict(pool), decode=dict(pool))


def patch_spec(kube: KubeApi, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
    kube.request(
        "PATCH",
        DISAGG_DEPLOYMENT.path(namespace, name),
        query=[("fieldManager", "kubectl-edit")],
        body={"spec": dict(spec)},
        content_type=MERGE_PATCH,
    )


def _patched(kube: KubeApi, namespace: str, name: str, spec: Mapping[str, Any]) -> bool:
    try:
        patch_spec(kube, namespace, name, spec)
    except OSError:  # the API server unreachable (disagg.k8s.client.ApiUnreachable)
        return False
    return True


def child_replicas(kube: KubeApi, namespace: str, name: str) -> int | None:
    obj = kube.get(DEPLOYMENT, namespace, name)
    return None if obj is None else int((obj.get("spec") or {}).get("replicas", 0))


def _settled(kube: KubeApi, namespace: str) -> Callable[[], Survey | None]:
    def check() -> Survey | None:
        found = survey(kube, namespace)
        return found if found.settled else None

    return check


def wait_settled(kube: KubeApi, namespace: str, timeout_s: float) -> Survey:
    """Until every deployment of ``namespace`` has converged (see :class:`Survey`); the survey then."""
    found = wait_for(
        _settled(kube, namespace),
        timeout_s=timeout_s,
        interval_s=1.0,
        what=f"deployments converged in {namespace}",
    )
    if found is None:  # wait_for returns only what is truthy
        raise WaitTimeout(f"deployments converged in {namespace}")
    return found


def _object(kube: KubeApi, namespace: str, name: str) -> JsonDict:
    return kube.get(DISAGG_DEPLOYMENT, namespace, name) or {}


# -- 1. the operator SIGKILLed during a rollout ---------------------------------------------------------
@dataclass(frozen=True)
class OperatorKillSettings:
    deployments: int = 100  # the issue's rollout; the test runs 30
    kills: int = 3
    seed: int = 13
    kill_after_s: tuple[float, float] = (1.0, 4.0)  # a kill comes this long after its chunk was applied
    converge_timeout_s: float = 240.0


def operator_killed(cc: ChaosCluster, settings: OperatorKillSettings = OperatorKillSettings()) -> CaseResult:
    """N deployments (the vllm-nixl example under N names) applied in chunks while the operator is
    SIGKILLed after each but the last chunk (at a seeded random moment) and restarted; while it is down one
    deployment applied earlier is deleted (the restarted operator must release it). Then every deployment
    must converge: exactly its rendered children, each owned once, status for the current generation, no
    child left whose owner is gone."""
    kube, rng = cc.kube, random.Random(settings.seed)
    ns = cc.namespace("chaos-operator-killed")
    names = [f"llama-{i:02d}" for i in range(settings.deployments)]
    size = -(-len(names) // (settings.kills + 1))
    chunks = [names[i : i + size] for i in range(0, len(names), size)]
    operator = cc.operator(ns, "operator-killed-0.log")
    applied: list[str] = []
    deleted: list[str] = []
    partial_at_kill: list[int] = []
    last_restart = time.monotonic()
    try:
        for index, chunk in enumerate(chunks):
            for name in chunk:
                apply_deployment(kube, example_deployment(ns, name))
                applied.append(name)
            if index == len(chunks) - 1:
                break
            time.sleep(rng.uniform(*settings.kill_after_s))  # the operator is mid-rollout: the chaos
            operator.kill()
            at_kill = survey(kube, ns)
            partial_at_kill.append(at_kill.deployments - at_kill.converged)
            victim = rng.choice(sorted(set(applied) - set(deleted)))
            kube.delete(DISAGG_DEPLOYMENT, ns, victim)
            deleted.append(victim)
            operator = cc.operator(ns, f"operator-killed-{index + 1}.log")
            last_restart = time.monotonic()
        problems: list[str] = []
        try:
            final = wait_settled(kube, ns, settings.converge_timeout_s)
        except WaitTimeout as timeout:
            final = survey(kube, ns)
            problems.append(f"{timeout}: {final}")
        converge_s = time.monotonic() - last_restart
        left = {d["metadata"]["name"] for d in kube.list(DISAGG_DEPLOYMENT, ns)}
        if final.duplicates:
            problems.append(f"{final.duplicates} duplicate children")
        if final.orphans:
            problems.append(f"{final.orphans} orphaned children")
        if left & set(deleted):
            problems.append(
                f"deleted while the operator was down, still there: {sorted(left & set(deleted))}"
            )
        if not operator.alive():
            problems.append("the last operator exited")
        return CaseResult(
            case="operator-killed",
            done=(
                f"SIGKILLed the operator {len(deleted)}x during a rollout of {len(applied)} deployments "
                f"(seed {settings.seed}), deleting one deployment while it was down each time"
            ),
            figures={
                "kills": len(deleted),
                "dds": len(applied),
                "deleted": len(deleted),
                "unconverged_at_kills": "/".join(str(n) for n in partial_at_kill),
                "converged": final.converged,
                "converge_s": converge_s,
                "duplicates": final.duplicates,
                "missing": final.missing,
                "orphans": final.orphans,
            },
            target="every DD converged, 0 duplicates, 0 orphans",
            problems=tuple(problems),
        )
    finally:
        operator.stop()
        cc.drop_namespace(ns)


# -- 1b. the operator SIGKILLed while it autoscales ------------------------------------------------------
@dataclass(frozen=True)
class AutoscalingKillSettings:
    kills: int = 5
    seed: int = 29
    # the fake engines alternate: TTFT 3 s with 1 s queued (the policy grows the pools), then no requests
    # at all (it shrinks them once the metric window has no arrivals), for run_s; the kills fall at seeded
    # random moments of it (at least min_gap_s apart, so each restarted operator is live and evaluating):
    # anywhere in an evaluation's cycle (observe, decide, status write, the reconciler applying it)
    phase_s: float = 30.0
    run_s: float = 120.0
    min_gap_s: float = 6.0
    available_timeout_s: float = 120.0
    converge_timeout_s: float = 60.0
    poll_s: float = 0.2
    min_moves: int = 3  # fewer recorded moves: the policy did not act, and the case proves nothing


Decision = tuple[
    str, int, int, str
]  # (time, prefill, decode, cause): one entry of status.autoscaling.decisions


@dataclass(frozen=True)
class AutoscalingSnapshot:
    """What a poll of the deployment and its two pools saw."""

    at: float
    operator: int  # which operator run (0: the first; each restart adds one)
    history: tuple[Decision, ...]  # newest first, as status keeps it
    desired: tuple[int, int] | None
    last_evaluation: str | None
    memory: bool  # status.autoscaling.policyMemory present
    cause: str | None  # status.autoscaling.lastEvaluation.cause
    children: tuple[int | None, int | None]


def autoscaling_snapshot(
    at: float, operator: int, auto: AutoscalingStatus, children: tuple[int | None, int | None]
) -> AutoscalingSnapshot:
    """A poll's record of ``status.autoscaling`` (read with the API's own model) and the pools' replicas."""
    desired = auto.desired_replicas
    return AutoscalingSnapshot(
        at=at,
        operator=operator,
        history=tuple((d.time, d.prefill, d.decode, d.cause) for d in auto.decisions),
        desired=(desired.prefill, desired.decode) if desired else None,
        last_evaluation=auto.last_evaluation_time,
        memory=auto.policy_memory is not None,
        cause=auto.last_evaluation.cause if auto.last_evaluation else None,
        children=children,
    )


def history_problems(before: tuple[Decision, ...], after: tuple[Decision, ...]) -> list[str]:
    """What went wrong between two readings of the bounded, newest-first decision history: ``after`` must
    be ``before`` with k new entries, each later than its newest, put in front and its oldest dropped to the
    bound (an entry lost, rewritten or reordered is status history lost), and no entry may be there twice."""
    problems: list[str] = []
    if len({d[0] for d in after}) != len(after):
        problems.append(f"two decisions at one time: {[d[0] for d in after]}")
    for newer, older in itertools.pairwise(after):
        if newer[1:3] == older[1:3]:
            problems.append(f"the move to {newer[1]}:{newer[2]} recorded twice ({older[0]}, {newer[0]})")
    head = parse_rfc3339(before[0][0]) if before else None

    def all_later(entries: tuple[Decision, ...]) -> bool:
        if head is None:
            return True
        times = [parse_rfc3339(d[0]) for d in entries]
        return all(t is not None and t > head for t in times)

    # k entries new at the head (each later than the head before), the rest a prefix of before
    kept = any(
        after[k:] == before[: len(after) - k] and all_later(after[:k])
        for k in range(len(after) + 1)
        if len(after) - k <= len(before)
    )
    if not kept:
        problems.append(f"history rewritten: {[d[0] for d in before]} -> {[d[0] for d in after]}")
    return problems


def kill_moments(rng: random.Random, settings: AutoscalingKillSettings) -> list[float]:
    """``kills`` seeded moments in (min_gap_s, run_s - min_gap_s), each at least min_gap_s after the last."""
    span = settings.run_s - (settings.kills + 1) * settings.min_gap_s
    if span < 0:
        raise ValueError(
            f"{settings.kills} kills {settings.min_gap_s} s apart do not fit in {settings.run_s} s"
        )
    slack = sorted(rng.uniform(0.0, span) for _ in range(settings.kills))
    return [gap + (i + 1) * settings.min_gap_s for i, gap in enumerate(slack)]


def autoscaling_problems(
    snapshots: list[AutoscalingSnapshot], interval_s: float, initial: tuple[int, int]
) -> list[str]:
    """The checks of :func:`operator_killed_autoscaling` over its polls (pure: kept apart to be tested)."""
    problems: list[str] = []
    for before, after in itertools.pairwise(snapshots):
        for problem in history_problems(before.history, after.history):
            problems.append(f"operator run {after.operator}: {problem}")
        if before.memory and not after.memory:
            problems.append(f"operator run {after.operator}: policyMemory lost")
    evaluations = sorted({s.last_evaluation for s in snapshots if s.last_evaluation})
    # lastEvaluationTime has seconds precision: two evaluations one interval apart may read 1 s closer
    for earlier, later in itertools.pairwise(evaluations):
        t0, t1 = parse_rfc3339(earlier), parse_rfc3339(later)
        if t0 is not None and t1 is not None and t1 - t0 < interval_s - 1.0:
            problems.append(f"evaluated {t1 - t0:.0f} s after the one before ({later}): decided twice")
    # the pool sizes something asked for: the start, every recorded move, every desiredReplicas seen
    asked = {initial} | {d[1:3] for s in snapshots for d in s.history}
    asked |= {s.desired for s in snapshots if s.desired is not None}
    for snap in snapshots:
        for i, role in enumerate(("prefill", "decode")):
            count = snap.children[i]
            if count is not None and count not in {pair[i] for pair in asked}:
                problems.append(f"{role} pool at {count}, which no recorded decision asked for")
    return sorted(set(problems), key=problems.index)


def operator_killed_autoscaling(
    cc: ChaosCluster, settings: AutoscalingKillSettings = AutoscalingKillSettings()
) -> CaseResult:
    """An autoscaled deployment whose RatioPolicy (slo-feedback, 5 s evaluations) reads fake engines that
    alternate between a TTFT breach and no traffic, so the policy moves the pools up and down; the operator is
    SIGKILLed at seeded random moments of its evaluation cycle and restarted. Polled every
    ``poll_s``: the decision history in status may only grow at its head (none lost, rewritten or recorded
    twice), policyMemory survives, no evaluation comes sooner than the policy's interval after the last
    (a restart re-deciding what was just decided), the pools only ever take replica counts a recorded
    decision asked for, and after the last restart they converge on the last one."""
    kube, rng = cc.kube, random.Random(settings.seed)
    ns = cc.namespace("chaos-autoscaling-killed")
    demo = DemoSettings(
        namespace=ns,
        deployment="chat",
        policy="chat-slo",
        gpu_type="h200",
        model_cache_claim=None,
        ready_when_served=False,
        prefill_replicas=1,
        decode_replicas=1,
        max_replicas=4,
        max_gpus=8,
        scale_down_window_s=5,
    )
    initial = (demo.prefill_replicas, demo.decode_replicas)
    workdir = cc.workdir / "operator-killed-autoscaling"
    snapshots: list[AutoscalingSnapshot] = []
    run_index = [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(settings.poll_s):
            try:
                obj = kube.get(DISAGG_DEPLOYMENT, ns, demo.deployment) or {}
                children = tuple(
                    child_replicas(kube, ns, f"{demo.deployment}-{r}") for r in ("prefill", "decode")
                )
            except (ApiException, OSError):
                continue
            auto = AutoscalingStatus.model_validate((obj.get("status") or {}).get("autoscaling") or {})
            snapshots.append(
                autoscaling_snapshot(time.monotonic(), run_index[0], auto, (children[0], children[1]))
            )

    def breach(engines: Mapping[str, FakeEngine], on: bool) -> None:
        for engine in engines.values():
            engine.ttft_s, engine.queue_s, engine.idle = (3.0, 1.0, False) if on else (0.1, 0.004, True)

    env = {"DISAGG_AUTOSCALING_TICK_S": "1"}
    poller = threading.Thread(target=poll, name="autoscaling-poll", daemon=True)
    with fake_engines(count_requests=True) as engines:
        prom = start_prometheus(
            engines_scrape_config(engines, ns, demo.deployment),
            workdir,
            PrometheusSettings(tie_to_parent=True),
        )
        args = ["--prometheus-url", prom.url]
        operator = cc.operator(ns, "operator-autoscaling-0.log", args, env=env)
        problems: list[str] = []
        kills_at: list[str] = []
        converge_s = float("nan")
        try:
            kube.apply(ratio_policy_manifest(demo), FIELD_MANAGER, kind=RATIO_POLICY)
            apply_deployment(kube, deployment_manifest(demo))
            wait_for(
                lambda: _condition(_object(kube, ns, demo.deployment), "MetricsAvailable") == "True",
                settings.available_timeout_s,
                0.5,
                "MetricsAvailable True at first",
            )
            poller.start()
            started = time.monotonic()
            kill_at = kill_moments(rng, settings)
            while (elapsed := time.monotonic() - started) < settings.run_s:
                breach(engines, int(elapsed // settings.phase_s) % 2 == 0)
                if kill_at and elapsed >= kill_at[0]:
                    kill_at.pop(0)
                    operator.kill()
                    kills_at.append(f"{elapsed:.1f}")
                    run_index[0] += 1
                    operator = cc.operator(ns, f"operator-autoscaling-{run_index[0]}.log", args, env=env)
                time.sleep(0.2)
            breach(engines, False)
            restarted = time.monotonic()

            def converged() -> bool:
                if not snapshots or time.monotonic() - snapshots[-1].at > 5 * settings.poll_s:
                    return False
                last = snapshots[-1]
                return last.desired is not None and last.children == last.desired

            try:
                wait_for(converged, settings.converge_timeout_s, 0.5, "the pools at the last decision")
            except WaitTimeout as timeout:
                problems.append(str(timeout))
            converge_s = time.monotonic() - restarted
        finally:
            stop.set()
            if poller.is_alive():
                poller.join(timeout=5)
            operator.stop()
            prom.stop()
            cc.drop_namespace(ns)
    problems.extend(autoscaling_problems(snapshots, float(demo.evaluation_interval_s), initial))
    moves = {d for s in snapshots for d in s.history}
    after_restart = {d for s in snapshots if s.operator > 0 for d in s.history} - {
        d for s in snapshots if s.operator == 0 for d in s.history
    }
    if len(moves) < settings.min_moves:
        problems.append(f"only {len(moves)} moves recorded: the policy did not act enough to test")
    if not after_restart:
        problems.append("no move decided by a restarted operator")
    return CaseResult(
        case="operator-killed-autoscaling",
        done=(
            f"SIGKILLed the operator {len(kills_at)}x (at {', '.join(kills_at)} s; seed {settings.seed}) "
            "while "
            f"its RatioPolicy moved an autoscaled deployment up and down every {demo.evaluation_interval_s} s"
        ),
        figures={
            "kills": len(kills_at),
            "moves": len(moves),
            "moves_after_restart": len(after_restart),
            "targets": ">".join(f"{p}:{d}" for _, p, d, _ in sorted(moves)),
            "polls": len(snapshots),
            "causes": ",".join(sorted({s.cause for s in snapshots if s.cause})),
            "converge_s": converge_s,
        },
        target="0 history lost or rewritten, 0 decisions recorded or evaluated twice, "
        "0 unrecorded pool sizes",
        problems=tuple(problems),
    )


# -- 2. the API server or etcd down while the operator reconciles --------------------------------------
@dataclass(frozen=True)
class ApiOutageSettings:
    deployments: int = 3
    outage_s: float = 20.0
    recover_target_s: float = 30.0
    recover_timeout_s: float = 120.0
    # after recovery the operator is watched this long for a hot loop: writes to objects nobody changed,
    # as the API server counts them
    quiet_s: float = 15.0
    settle_quiet_s: float = 5.0
    settle_timeout_s: float = 30.0


def apiserver_outage(cc: ChaosCluster, settings: ApiOutageSettings = ApiOutageSettings()) -> CaseResult:
    """The API server SIGKILLed for ``outage_s`` while the operator runs (see :func:`component_outage`)."""
    return component_outage(cc, "kube-apiserver", settings)


def etcd_outage(cc: ChaosCluster, settings: ApiOutageSettings = ApiOutageSettings()) -> CaseResult:
    """etcd SIGKILLed for ``outage_s``, the API server left running and answering errors (see
    :func:`component_outage`)."""
    return component_outage(cc, "etcd", settings)


def _apiserver_writes(cc: ChaosCluster) -> dict[str, float]:
    """The API server's own count of writes to the operator's objects (:func:`operator_writes`); restarted
    with the API server, so compared within one run."""
    with cc.info.client() as client:
        response = client.get("/metrics")
        response.raise_for_status()
        return operator_writes(response.text)


def _spec_writes_by_resource(cc: ChaosCluster) -> dict[str, float]:
    """Writes to deployments (spec and status) and to children's specs, by resource; not Events, which
    other controllers write too."""
    return {k: v for k, v in _apiserver_writes(cc).items() if k != "events"}


def increase(before: Mapping[str, N], after: Mapping[str, N]) -> dict[str, N]:
    """What each counter (writes by resource, Events by reason) gained between two readings; keys that
    did not grow are left out."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}


def writes_between(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int]:
    """Writes counted between two readings of :func:`_spec_writes_by_resource`, by resource."""
    return {k: int(v) for k, v in increase(before, after).items()}


def _statuses(kube: KubeApi, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        str(obj["metadata"]["name"]): dict(obj.get("status") or {})
        for obj in kube.list(DISAGG_DEPLOYMENT, namespace)
    }


def changed_status_fields(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """``name.field`` for each top-level status field of a deployment that differs between two readings
    (a status write that changes none is a write for nothing)."""
    changed: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name, {}), after.get(name, {})
        changed += [f"{name}.{key}" for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    return changed


def changed_summary(changed: list[str]) -> str:
    """``fields in N deployments`` for :func:`changed_status_fields`' list, ``-`` for none."""
    if not changed:
        return "-"
    names = {c.split(".", 1)[0] for c in changed}
    fields = sorted({c.split(".", 1)[1] for c in changed})
    return f"{'/'.join(fields)} in {len(names)}"


def _spec_writes(cc: ChaosCluster) -> float:
    return sum(_spec_writes_by_resource(cc).values())


def _wait_quiet(cc: ChaosCluster, quiet_s: float, timeout_s: float) -> float:
    """Wait out a rollout's last writes (pods turning Ready are reported once, kopf records each creation
    handled): until ``quiet_s`` pass without one, at most ``timeout_s``. Returns the seconds until the
    last write seen. A hot loop never goes quiet, and the idle window that follows counts it all the same.
    """
    start = quiet_from = time.monotonic()
    last = _spec_writes(cc)
    while time.monotonic() < start + timeout_s and time.monotonic() - quiet_from < quiet_s:
        time.sleep(1.0)
        now_writes = _spec_writes(cc)
        if now_writes != last:
            quiet_from, last = time.monotonic(), now_writes
    return quiet_from - start


def component_outage(cc: ChaosCluster, component: str, settings: ApiOutageSettings) -> CaseResult:
    """``component`` (the API server or etcd) SIGKILLed for ``outage_s`` while the operator runs, a spec
    change made just before and one just after; both must be applied once it is back, and the operator
    must then go quiet (its writes over ``quiet_s`` are counted: a hot loop shows as writes to objects
    nobody changed). The operator's log during the outage and the recovery is searched for Python
    tracebacks (losing the API server used to raise urllib3's MaxRetryError through kopf's handlers)."""
    kube = cc.kube
    cc.wait_namespaces_gone()  # their deletion writes too
    short = "apiserver" if component == "kube-apiserver" else component
    ns = cc.namespace(f"chaos-{short}")
    names = [f"small-{i}" for i in range(settings.deployments)]
    operator = cc.operator(ns, f"operator-{short}.log")
    try:
        for name in names:
            apply_deployment(kube, small_deployment(ns, name))
        wait_settled(kube, ns, 120.0)
        before, after = names[0], names[-1]
        patch_spec(kube, ns, before, {"decode": {"replicas": 2}})  # just before it goes
        offset = operator.log_size()
        with cc.local.component_down(component):
            time.sleep(settings.outage_s)  # the outage itself
            alive_during = operator.alive()
        back = time.monotonic()
        # right after it is back (this client's pooled connections died with the server: retried)
        wait_for(
            lambda: _patched(kube, ns, after, {"decode": {"replicas": 2}}), 30.0, what=f"patching {after}"
        )
        problems: list[str] = []

        def applied() -> bool:
            return all(child_replicas(kube, ns, f"{n}-decode") == 2 for n in (before, after)) and bool(
                _settled(kube, ns)()
            )

        try:
            wait_for(applied, timeout_s=settings.recover_timeout_s, interval_s=0.5, what="both spec changes")
        except WaitTimeout as timeout:
            problems.append(str(timeout))
        recover_s = time.monotonic() - back
        # the change's own last writes (status as the new pods turn Ready) are waited out first, as in the
        # other cases: a hot loop never goes quiet, and the window below counts it all the same
        recovered_writes = _spec_writes_by_resource(cc)
        trailing_s = _wait_quiet(cc, settings.settle_quiet_s, settings.settle_timeout_s)
        writes_before = _spec_writes_by_resource(cc)
        trailing_by = writes_between(recovered_writes, writes_before)
        statuses_before = _statuses(kube, ns)
        time.sleep(settings.quiet_s)
        quiet_by = writes_between(writes_before, _spec_writes_by_resource(cc))
        changed = changed_status_fields(statuses_before, _statuses(kube, ns))
        quiet_writes = sum(quiet_by.values())
        # writes with nothing to show for them: a child's spec written again, or a deployment's status
        # written while no status field of any deployment changed (the children's pods may change state
        # after an outage, and reporting that is the operator's job)
        idle_writes = sum(v for k, v in quiet_by.items() if not k.endswith("/status")) + (
            0 if changed else sum(v for k, v in quiet_by.items() if k.endswith("/status"))
        )
        log = operator.log_since(offset)
        found = tracebacks(log)
        errors = sum(1 for line in log.splitlines() if " ERROR " in line)
        if not alive_during or not operator.alive():
            problems.append("the operator exited")
        kinds = sorted({t.split(":")[0] for t in found})
        return CaseResult(
            case=f"{short}-outage",
            done=f"SIGKILLed {component} for {settings.outage_s:.0f} s under a running operator, then "
            "restarted it; a spec change just before and one just after",
            figures={
                "outage_s": settings.outage_s,
                "recover_s": recover_s,
                "tracebacks": len(found),
                "exceptions": ",".join(kinds) or "-",
                "error_lines": errors,
                "trailing_writes_s": trailing_s,
                "trailing_writes_by": ",".join(f"{k}:{v}" for k, v in sorted(trailing_by.items())) or "-",
                f"writes_in_{settings.quiet_s:.0f}s_after": int(quiet_writes),
                "writes_after_by": ",".join(f"{k}:{v}" for k, v in sorted(quiet_by.items())) or "-",
                "status_changed_after": changed_summary(changed),
                "idle_writes": idle_writes,
            },
            target=f"changes applied within {settings.recover_target_s:.0f} s, 0 tracebacks, "
            "no writes while nothing changes (status writes that track a change aside)",
            problems=tuple(problems),
            target_met=not problems
            and recover_s <= settings.recover_target_s
            and not found
            and not idle_writes,
        )
    finally:
        operator.stop()
        cc.drop_namespace(ns)


# -- 2b. HA: the leader of two peered operators SIGKILLed while deployments change ---------------------
KOPF_PEERING_CRDS = ROOT / "charts" / "disagg-operator" / "crds" / "kopf-peering.yaml"


@dataclass(frozen=True)
class FailoverSettings:
    deployments: int = 6
    peering_lifetime_s: int = 10
    churn_every_s: float = 0.5  # a spec change to one of the deployments this often, all case long
    overlap_s: float = 15.0  # both operators up, the leader acting, before the kill
    after_return_s: float = 15.0  # the killed leader restarted: the standby must pause again
    resume_timeout_s: float = 120.0


# the operator's own write counters (disagg.controller.metrics)
OPERATOR_WRITE_COUNTERS = frozenset({"disagg_operator_child_changes", "disagg_operator_status_writes"})


def _operator_writes(metrics_url: str) -> float:
    """Children changed plus status patches, by the operator's own counters."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name in OPERATOR_WRITE_COUNTERS
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def ha_failover(cc: ChaosCluster, settings: FailoverSettings = FailoverSettings()) -> CaseResult:
    """Two operators peered through a KopfPeering (priorities 20 and 10), spec changes to the deployments
    every ``churn_every_s`` all along. While the leader runs, the standby must write nothing; the leader
    is SIGKILLed (its peering record stays until it expires) and a change made at that moment must be
    applied by the standby (time to resume, target: the peering lifetime plus one resync); the leader is
    then restarted and the standby must pause again (its writes after the leader's return, past one
    lifetime of handover, are double writes). At the end every deployment has its children at the last
    spec, no duplicates, no orphans."""
    kube = cc.kube
    cc.wait_namespaces_gone()
    ns = cc.namespace("chaos-ha")
    for crd in yaml.safe_load_all(KOPF_PEERING_CRDS.read_text()):
        kube.apply(crd, FIELD_MANAGER)
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "disagg", "namespace": ns},
    }
    wait_for(lambda: apply_when_served(kube, peering, KOPF_PEERING), 30.0, what="the KopfPeering CRD served")
    names = [f"ha-{i}" for i in range(settings.deployments)]
    lifetime = settings.peering_lifetime_s

    def peered(priority: int, log_name: str) -> tuple[OperatorRun, str]:
        (port,) = free_ports(1)
        args = [
            "--peering",
            "disagg",
            "--peering-lifetime",
            str(lifetime),
            "--peering-priority",
            str(priority),
        ]
        args += ["--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
        return cc.operator(ns, log_name, args), f"http://127.0.0.1:{port}/metrics"

    standby, standby_metrics = peered(10, "operator-ha-standby.log")
    leader, _ = peered(20, "operator-ha-leader-0.log")
    stop = threading.Event()
    last: dict[str, int] = {}
    churn_errors: list[str] = []
    changes = [0]

    def churn() -> None:
        i = 0
        while not stop.wait(settings.churn_every_s):
            name, replicas = names[i % len(names)], 1 + (i // len(names)) % 2
            try:
                patch_spec(kube, ns, name, {"prefill": {"replicas": replicas}})
                last[name] = replicas
                changes[0] += 1
            except (ApiException, WaitTimeout) as error:
                churn_errors.append(f"{name}: {error}")
            i += 1

    thread = threading.Thread(target=churn, name="ha-churn", daemon=True)
    problems: list[str] = []
    try:
        for name in names:
            apply_deployment(kube, small_deployment(ns, name))
        wait_settled(kube, ns, 120.0)
        thread.start()
        base = _operator_writes(standby_metrics)
        time.sleep(settings.overlap_s)
        standby_while_leading = _operator_writes(standby_metrics) - base
        probe = "ha-probe"
        base = _operator_writes(standby_metrics)
        leader.kill()
        killed = time.monotonic()
        apply_deployment(kube, small_deployment(ns, probe))
        try:
            wait_for(
                lambda: child_replicas(kube, ns, f"{probe}-decode") is not None,
                settings.resume_timeout_s,
                interval_s=0.25,
                what="the standby to create the children of a deployment made at the kill",
            )
        except WaitTimeout as timeout:
            problems.append(str(timeout))
        resume_s = time.monotonic() - killed
        standby_while_leader_down = _operator_writes(standby_metrics) - base
        leader, _ = peered(20, "operator-ha-leader-1.log")
        time.sleep(lifetime)  # the handover: the standby sees the leader's record within one lifetime
        base = _operator_writes(standby_metrics)
        time.sleep(settings.after_return_s)
        standby_after_return = _operator_writes(standby_metrics) - base
        stop.set()
        thread.join(10.0)

        def at_last_spec() -> bool:
            return all(child_replicas(kube, ns, f"{n}-prefill") == r for n, r in last.items()) and bool(
                _settled(kube, ns)()
            )

        try:
            wait_for(at_last_spec, timeout_s=60.0, interval_s=0.5, what="every deployment at its last spec")
        except WaitTimeout as timeout:
            problems.append(str(timeout))
        final = survey(kube, ns)
        if standby_while_leading:
            problems.append(f"the standby wrote {standby_while_leading:.0f}x while the leader ran")
        if standby_after_return:
            problems.append(f"the standby wrote {standby_after_return:.0f}x after the leader returned")
        if final.duplicates or final.orphans:
            problems.append(f"{final.duplicates} duplicate, {final.orphans} orphaned children")
        if not standby.alive() or not leader.alive():
            problems.append("an operator exited")
        target_s = lifetime + RESYNC_INTERVAL_S
        return CaseResult(
            case="ha-failover",
            done=f"two peered operators (lifetime {lifetime} s), a spec change every "
            f"{settings.churn_every_s} s, the leader SIGKILLed, then restarted",
            figures={
                "dds": final.deployments,
                "spec_changes": changes[0],
                "resume_s": resume_s,
                "standby_writes_while_leading": int(standby_while_leading),
                "standby_writes_while_leader_down": int(standby_while_leader_down),
                "standby_writes_after_return": int(standby_after_return),
                "duplicates": final.duplicates,
                "orphans": final.orphans,
                "churn_errors": len(churn_errors),
            },
            target=f"resumed within {target_s:.0f} s (lifetime + one resync), 0 double writes",
            problems=tuple(problems),
            target_met=not problems and resume_s <= target_s,
        )
    finally:
        stop.set()
        leader.stop()
        standby.stop()
        cc.drop_namespace(ns)


def apply_when_served(
    kube: KubeApi, obj: Mapping[str, Any], kind: Kind, field_manager: str = FIELD_MANAGER
) -> bool:
    """Apply ``obj``; False while its CRD is not served yet (404), to poll with ``wait_for``."""
    try:
        kube.apply(obj, field_manager, kind=kind)
    except ApiException as error:
        if error.status == 404:  # the CRD is not served yet
            return False
        raise
    return True


# -- 3. Prometheus down under an autoscaled deployment -------------------------------------------------
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


class FakeEngine:
    """vLLM's metrics of one engine pod in a private registry, served on loopback, fed steady traffic at
    the SLO (TTFT and ITL near their targets, so the policy has no reason to move)."""

    def __init__(self, role: str, ttft_s: float, itl_s: float, count_requests: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        self.role = role
        # names: vllm-project/vllm docs/design/metrics.md (as disagg.metrics.queries reads them)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "q", buckets=LATENCY_BUCKETS, registry=r)
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds", "prefill", buckets=LATENCY_BUCKETS, registry=r
        )
        self.prompt = Histogram("vllm:request_prompt_tokens", "prompt", buckets=TOKEN_BUCKETS, registry=r)
        self.output = Histogram("vllm:request_generation_tokens", "output", buckets=TOKEN_BUCKETS, registry=r)
        Gauge("vllm:num_requests_waiting", "waiting", registry=r).set(0)
        Gauge("vllm:num_requests_running", "running", registry=r).set(1)
        # vllm:request_success_total{finished_reason}: vllm-project/vllm docs/design/metrics.md. Off by
        # default: without it the request rate is missing and the policy holds the pools wherever the
        # latencies are at their SLOs (what the Prometheus cases need); with it an idle engine's zero rate
        # lets the policy shrink an idle deployment
        self.success = (
            Counter("vllm:request_success", "finished", ["finished_reason"], registry=r).labels("stop")
            if count_requests
            else None
        )
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.queue_s = 0.004
        self.idle = False  # True: no requests arrive (feed observes nothing)
        server, _ = start_http_server(0, addr="127.0.0.1", registry=r)
        self.server = server
        self.port = int(server.server_port)

    def feed(self) -> None:
        """One request's worth of observations (none while idle)."""
        if self.idle:
            return
        self.ttft.observe(self.ttft_s)
        self.queue.observe(self.queue_s)
        self.prefill.observe(0.15)
        self.prompt.observe(1000)
        self.output.observe(100)
        if self.success is not None:
            self.success.inc()
        for _ in range(10):
            self.itl.observe(self.itl_s)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def fake_engines(rate_hz: float = 10.0, count_requests: bool = False) -> Iterator[dict[str, FakeEngine]]:
    # histogram_quantile interpolates inside a bucket: all observations in (0.5, 1.0] give p90 0.95 s,
    # plus the decode side's (0, 0.005] ~0.005 s: TTFT 0.955 s against 1 s; ITL in (0.03, 0.05]: 0.048 s
    engines = {
        "prefill": FakeEngine("prefill", 0.9, 0.04, count_requests),
        "decode": FakeEngine("decode", 0.004, 0.04, count_requests),
    }
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(1.0 / rate_hz):
            for engine in engines.values():
                engine.feed()

    thread = threading.Thread(target=run, name="fake-engines", daemon=True)
    thread.start()
    try:
        yield engines
    finally:
        stop.set()
        thread.join(timeout=5)
        for engine in engines.values():
            engine.close()


def engines_scrape_config(
    engines: Mapping[str, FakeEngine], namespace: str, deployment: str
) -> dict[str, Any]:
    """Static targets with the labels the pod relabelling would attach to the engine pods."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": f"engines-{role}",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{engine.port}"],
                        "labels": {
                            "namespace": namespace,
                            "pod": f"{deployment}-{role}-0",
                            "disagg_deployment": deployment,
                            "disagg_role": role,
                        },
                    }
                ],
            }
            for role, engine in engines.items()
        ],
    }


def _condition(obj: Mapping[str, Any], kind: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def _port(url: str) -> int:
    match = re.search(r":(\d+)$", url)
    if match is None:
        raise ValueError(f"no port in {url}")
    return int(match.group(1))


@dataclass(frozen=True)
class PrometheusOutageSettings:
    outage_s: float = 20.0  # Prometheus stays down this long after the operator noticed
    detect_timeout_s: float = 60.0
    recover_timeout_s: float = 60.0
    available_timeout_s: float = 120.0
    gpu_type: str = "h200"


def prometheus_outage(
    cc: ChaosCluster, settings: PrometheusOutageSettings = PrometheusOutageSettings()
) -> CaseResult:
    """An autoscaled deployment (2:2, at its SLOs) with a RatioPolicy reading a real Prometheus, which is
    stopped: MetricsAvailable must turn False and no replica may go away while it is (fail-static); then
    Prometheus comes back on the same port and MetricsAvailable must turn True again."""
    kube = cc.kube
    ns = cc.namespace("chaos-prometheus")
    demo = DemoSettings(
        namespace=ns,
        deployment="chat",
        policy="chat-slo",
        gpu_type=settings.gpu_type,
        model_cache_claim=None,
        ready_when_served=False,
        prefill_replicas=2,
        decode_replicas=2,
        scale_down_window_s=5,  # a fail-open policy would shrink within the outage
    )
    workdir = cc.workdir / "prometheus-outage"
    prom_settings = PrometheusSettings(tie_to_parent=True)
    with fake_engines() as engines:
        config = engines_scrape_config(engines, ns, demo.deployment)
        prom: PrometheusProcess = start_prometheus(config, workdir, prom_settings)
        operator: OperatorRun | None = None
        try:
            operator = cc.operator(
                ns,
                "operator-prometheus.log",
                ["--prometheus-url", prom.url],
                env={"DISAGG_AUTOSCALING_TICK_S": "1"},
            )
            kube.apply(ratio_policy_manifest(demo), FIELD_MANAGER, kind=RATIO_POLICY)
            apply_deployment(kube, deployment_manifest(demo))

            def metrics(state: str) -> Callable[[], JsonDict]:
                def check() -> JsonDict:
                    obj = _object(kube, ns, demo.deployment)
                    return obj if _condition(obj, "MetricsAvailable") == state else {}

                return check

            problems: list[str] = []
            wait_for(metrics("True"), settings.available_timeout_s, 0.5, "MetricsAvailable True at first")
            prom.stop()
            stopped = time.monotonic()
            detect_s = recover_s = float("nan")
            shrinks: list[str] = []
            try:
                at_detection = wait_for(
                    metrics("False"), settings.detect_timeout_s, 0.25, "MetricsAvailable False"
                )
                detect_s = time.monotonic() - stopped
                held = _desired(at_detection)
                end = time.monotonic() + settings.outage_s
                while time.monotonic() < end:  # a window of observation, not a wait for a condition
                    now = _desired(_object(kube, ns, demo.deployment))
                    for role, count in held.items():
                        live = child_replicas(kube, ns, f"{demo.deployment}-{role}")
                        if (now.get(role) or count) < count or (live is not None and live < count):
                            shrinks.append(f"{role} {count} -> {now.get(role)} (child {live})")
                    time.sleep(0.5)
            except WaitTimeout as timeout:
                problems.append(str(timeout))
            if shrinks:
                problems.append(f"scaled down while metrics were missing: {shrinks[:3]}")
            prom = start_prometheus(config, workdir, replace(prom_settings, port=_port(prom.url)))
            restarted = time.monotonic()
            try:
                wait_for(metrics("True"), settings.recover_timeout_s, 0.25, "MetricsAvailable True again")
                recover_s = time.monotonic() - restarted
            except WaitTimeout as timeout:
                problems.append(str(timeout))
            if not operator.alive():
                problems.append("the operator exited")
            return CaseResult(
                case="prometheus-outage",
                done=f"stopped Prometheus under an autoscaled 2:2 deployment for {settings.outage_s:.0f} s "
                "after the operator noticed, then restarted it on the same port",
                figures={
                    "detect_s": detect_s,
                    "recover_s": recover_s,
                    "scale_downs_while_missing": len(shrinks),
                },
                target="MetricsAvailable False then True, 0 scale-downs while missing",
                problems=tuple(problems),
            )
        finally:
            if operator is not None:
                operator.stop()
            prom.stop()
            cc.drop_namespace(ns)


def _desired(obj: Mapping[str, Any]) -> dict[str, int]:
    auto = (obj.get("status") or {}).get("autoscaling") or {}
    desired = auto.get("desiredReplicas") or {}
    spec = obj.get("spec") or {}
    return {
        role: int(desired.get(role) or (spec.get(role) or {}).get("replicas") or 0)
        for role in ("prefill", "decode")
    }


# -- 3b. Prometheus answering errors, slowly or garbage ---------------------------------------------------
# what MetricsAvailable's message must name under each fault (disagg.controller.scaling_status): the state
# TTFT and ITL are in; None: the fault is a reading the policy may act on, so MetricsAvailable stays True
GARBAGE_STATES: dict[Fault, str | None] = {
    Fault.HTTP_500: "missing",
    Fault.SLOW: "missing",
    Fault.NAN: "nan",
    Fault.INF: "invalid",
    Fault.EMPTY: "missing",
    Fault.STALE: "stale",
    Fault.NEGATIVE: "invalid",
    Fault.HUGE: None,  # a TTFT of 1e30 s is a (dreadful) reading: scale up, within the bounds
}
# what it must add where Prometheus's queries failed (reason PrometheusQueryFailed, the error quoted)
GARBAGE_CAUSES: dict[Fault, str] = {
    Fault.HTTP_500: "PrometheusQueryFailed: TTFT is missing; ITL is missing: PrometheusApiClientException: "
    "HTTP Status Code 500",
    Fault.SLOW: "PrometheusQueryFailed: TTFT is missing; ITL is missing: Prometheus at",
}


@dataclass(frozen=True)
class PrometheusGarbageSettings:
    # huge last: the scale-up it causes is undone (legitimately) once the answers are real again
    faults: tuple[Fault, ...] = tuple(GARBAGE_STATES)
    hold_s: float = 10.0  # each fault held this long after the operator noticed: two evaluation intervals
    slow_s: float = 8.0  # the slow fault's delay: past the operator's 5 s Prometheus timeout
    detect_timeout_s: float = 40.0
    recover_timeout_s: float = 40.0
    available_timeout_s: float = 120.0
    gpu_type: str = "h200"


@dataclass(frozen=True)
class FaultOutcome:
    fault: Fault
    detect_s: float  # the fault switched on until MetricsAvailable said so (nan: it never did)
    says: str  # MetricsAvailable at the end of the hold: status, then the states its message names
    shrinks: tuple[str, ...]
    recover_s: float  # pass-through again until MetricsAvailable was True again
    tracebacks: int
    target: str  # desired prefill:decode at the end of the hold


def _metrics_condition(obj: Mapping[str, Any]) -> tuple[str | None, str]:
    """MetricsAvailable's status, and ``reason: message`` without the fail-static note."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "MetricsAvailable":
            message = str(cond.get("message") or "").split(" (the policy holds")[0]
            return str(cond.get("status")), f"{cond.get('reason')}: {message}"
    return None, ""


def prometheus_garbage(
    cc: ChaosCluster, settings: PrometheusGarbageSettings = PrometheusGarbageSettings()
) -> CaseResult:
    """An autoscaled deployment (2:2, at its SLOs) whose operator reads a real Prometheus through a
    fault-injecting proxy (:mod:`disagg.chaos.promproxy`). Each fault in turn: answers of HTTP 500, answers
    slower than the operator's timeout, every value NaN, +Inf, -1 or 1e30, empty vectors, samples older
    than the metric window. Under each, MetricsAvailable must turn False naming the state of TTFT and ITL
    (1e30 excepted: a reading, on which the policy may scale up within its bounds), no replica may go away
    (fail-static) and the operator must log no traceback; then the answers are passed through again and
    MetricsAvailable must turn True again (the time it takes is a figure)."""
    kube = cc.kube
    ns = cc.namespace("chaos-prometheus-garbage")
    demo = DemoSettings(
        namespace=ns,
        deployment="chat",
        policy="chat-slo",
        gpu_type=settings.gpu_type,
        model_cache_claim=None,
        ready_when_served=False,
        prefill_replicas=2,
        decode_replicas=2,
        scale_down_window_s=5,  # a fail-open policy would shrink within a fault's hold
    )
    workdir = cc.workdir / "prometheus-garbage"
    with fake_engines() as engines:
        config = engines_scrape_config(engines, ns, demo.deployment)
        prom = start_prometheus(config, workdir, PrometheusSettings(tie_to_parent=True))
        proxy = PrometheusProxy(prom.url, slow_s=settings.slow_s)
        operator: OperatorRun | None = None
        try:
            operator = cc.operator(
                ns,
                "operator-prometheus-garbage.log",
                ["--prometheus-url", proxy.url],
                env={"DISAGG_AUTOSCALING_TICK_S": "1"},
            )
            kube.apply(ratio_policy_manifest(demo), FIELD_MANAGER, kind=RATIO_POLICY)
            apply_deployment(kube, deployment_manifest(demo))

            def available() -> bool:
                return _metrics_condition(_object(kube, ns, demo.deployment))[0] == "True"

            problems: list[str] = []
            wait_for(available, settings.available_timeout_s, 0.5, "MetricsAvailable True at first")
            outcomes = [
                _hold_fault(cc, operator, proxy, ns, demo, fault, settings) for fault in settings.faults
            ]
            for o in outcomes:
                expected = GARBAGE_STATES[o.fault]
                if expected is not None and math.isnan(o.detect_s):
                    problems.append(f"{o.fault}: MetricsAvailable stayed True ({o.says})")
                elif expected is not None and not o.says.startswith("False"):
                    problems.append(f"{o.fault}: MetricsAvailable turned back to {o.says} under the fault")
                elif o.fault in GARBAGE_CAUSES and GARBAGE_CAUSES[o.fault] not in o.says:
                    problems.append(
                        f"{o.fault}: MetricsAvailable says {o.says!r}, not why the queries failed"
                    )
                elif expected is not None and f"is {expected}" not in o.says:
                    problems.append(
                        f"{o.fault}: MetricsAvailable says {o.says!r}, not that TTFT/ITL is {expected}"
                    )
                elif expected is None and not o.says.startswith("True"):
                    problems.append(
                        f"{o.fault}: MetricsAvailable {o.says} on a reading the policy may act on"
                    )
                if o.shrinks:
                    problems.append(
                        f"{o.fault}: scaled down while the answers were garbage: {list(o.shrinks[:3])}"
                    )
                if o.tracebacks:
                    problems.append(f"{o.fault}: {o.tracebacks} tracebacks in the operator's log")
                if expected is not None and math.isnan(o.recover_s):
                    problems.append(f"{o.fault}: MetricsAvailable not True again after pass-through")
            for o in outcomes:
                p, d = (int(n) for n in o.target.split(":"))
                if max(p, d) > demo.max_replicas or p + d > demo.max_gpus:
                    problems.append(f"{o.fault}: target {o.target} past the bounds")
            if not operator.alive():
                problems.append("the operator exited")
            figures: dict[str, Figure] = {}
            for o in outcomes:
                if GARBAGE_STATES[o.fault] is not None:
                    figures[f"{o.fault}_detect_s"] = o.detect_s
                    figures[f"{o.fault}_recover_s"] = o.recover_s
                figures[f"{o.fault}_says"] = shorten(o.says, 110)
            huge = [o for o in outcomes if o.fault is Fault.HUGE]
            if huge:
                figures["huge_target"] = huge[0].target
            figures["scale_downs_under_faults"] = sum(len(o.shrinks) for o in outcomes)
            figures["tracebacks"] = sum(o.tracebacks for o in outcomes)
            detected = [
                o.detect_s for o in outcomes if GARBAGE_STATES[o.fault] and not math.isnan(o.detect_s)
            ]
            recovered = [
                o.recover_s for o in outcomes if GARBAGE_STATES[o.fault] and not math.isnan(o.recover_s)
            ]
            figures["worst_detect_s"] = max(detected, default=float("nan"))
            figures["worst_recover_s"] = max(recovered, default=float("nan"))
            return CaseResult(
                case="prometheus-garbage",
                done="the operator read Prometheus through a faulty proxy under an autoscaled 2:2 "
                f"deployment, {len(outcomes)} faults ({', '.join(o.fault for o in outcomes)}) held "
                f"{settings.hold_s:.0f} s each after it noticed, pass-through between them",
                figures=figures,
                target="MetricsAvailable False naming the state (1e30: True, scaled up within bounds), "
                "0 scale-downs, 0 tracebacks, True again within 2 evaluations (10 s)",
                problems=tuple(problems),
                target_met=not problems and all(r <= 10.0 for r in recovered),
            )
        finally:
            if operator is not None:
                operator.stop()
            proxy.close()
            prom.stop()
            cc.drop_namespace(ns)


def _hold_fault(
    cc: ChaosCluster,
    operator: OperatorRun,
    proxy: PrometheusProxy,
    ns: str,
    demo: DemoSettings,
    fault: Fault,
    settings: PrometheusGarbageSettings,
) -> FaultOutcome:
    """One fault: switched on, held ``hold_s`` after MetricsAvailable shows it (at once for a fault it need
    not show), watched for scale-downs all along, then switched off until MetricsAvailable is True."""
    kube, name = cc.kube, demo.deployment
    offset = operator.log_size()
    obj = _object(kube, ns, name)
    held = _desired(obj)
    live_held = {role: child_replicas(kube, ns, f"{name}-{role}") or 0 for role in held}
    expect = "True" if GARBAGE_STATES[fault] is None else "False"
    shrinks: list[str] = []
    proxy.set(fault)
    started = time.monotonic()
    noticed: float | None = None
    while True:  # a window of observation, not a wait for a condition
        obj = _object(kube, ns, name)
        now = time.monotonic()
        desired = _desired(obj)
        for role, count in held.items():
            live = child_replicas(kube, ns, f"{name}-{role}")
            if desired.get(role, count) < count or (live is not None and live < live_held[role]):
                shrinks.append(f"{role} {count} -> {desired.get(role)} (child {live})")
        if noticed is None and _metrics_condition(obj)[0] == expect:
            noticed = now
        if noticed is not None and now - noticed >= settings.hold_s:
            break
        if noticed is None and now - started >= settings.detect_timeout_s:
            break
        time.sleep(0.25)
    status, message = _metrics_condition(obj)
    says = f"False/{message}" if status == "False" else str(status)
    target = ":".join(str(n) for n in _desired(obj).values())
    proxy.set(Fault.PASS)
    back = time.monotonic()
    recover_s = float("nan")
    try:
        wait_for(
            lambda: _metrics_condition(_object(kube, ns, name))[0] == "True",
            settings.recover_timeout_s,
            0.25,
            f"MetricsAvailable True after {fault}",
        )
        recover_s = time.monotonic() - back
    except WaitTimeout:
        pass
    return FaultOutcome(
        fault=fault,
        detect_s=float("nan") if noticed is None else noticed - started,
        says=says,
        shrinks=tuple(shrinks),
        recover_s=recover_s,
        tracebacks=len(tracebacks(operator.log_since(offset))),
        target=target,
    )


# -- 4. writes of an idle operator ----------------------------------------------------------------------
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})
# what the operator writes: its own objects (any subresource), its children (their spec: the controllers
# write the children's status), Events
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def operator_writes(metrics_text: str) -> dict[str, float]:
    """Write requests the API server counted on what the operator writes, by resource."""
    children = {k.plural for k in CHILD_KINDS}
    counts: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group("labels")))
        resource, sub = labels.get("resource", ""), labels.get("subresource", "")
        if labels.get("verb") not in WRITE_VERBS:
            continue
        if resource in {DISAGG_DEPLOYMENT.plural, "events"} or (resource in children and not sub):
            key = f"{resource}/{sub}" if sub else resource
            counts[key] = counts.get(key, 0.0) + float(match.group("value"))
    return counts


# the reporting component of the operator's Events: kopf's own (handler outcomes) and disagg.k8s.events'
OPERATOR_EVENT_SOURCES = frozenset({"kopf", "disagg", "disagg-operator"})


def _event_counts(kube: KubeApi, namespace: str) -> dict[str, int]:
    """Occurrences of the namespace's Events by reporter/reason (``count`` or ``series.count``)."""
    counts: dict[str, int] = {}
    for event in kube.list(EVENT, namespace):
        source = event.get("reportingComponent") or (event.get("source") or {}).get("component") or "?"
        key = f"{source}/{event.get('reason')}"
        n = int(event.get("count") or (event.get("series") or {}).get("count") or 1)
        counts[key] = counts.get(key, 0) + n
    return counts


@dataclass(frozen=True)
class IdleWritesSettings:
    deployments: int = 20
    window_s: float = 60.0


def idle_writes(cc: ChaosCluster, settings: IdleWritesSettings = IdleWritesSettings()) -> CaseResult:
    """N Ready deployments without autoscaling, nothing changing: the API server's own count of writes to
    the operator's objects and its children's specs over ``window_s`` (no other writer of those runs, so
    what it counts is the operator's), plus the Events the operator reported in their namespace."""
    kube = cc.kube
    cc.wait_namespaces_gone()  # their deletion writes too
    ns = cc.namespace("chaos-idle")
    operator = cc.operator(ns, "operator-idle.log")
    try:
        for i in range(settings.deployments):
            apply_deployment(kube, small_deployment(ns, f"idle-{i:02d}", gpu_type="h200"))
        final = wait_settled(kube, ns, 180.0)
        problems: list[str] = []

        def all_ready() -> bool:  # every pod Ready and said so in status: nothing left to report
            dds = kube.list(DISAGG_DEPLOYMENT, ns)
            return len(dds) == settings.deployments and all(_condition(d, "Ready") == "True" for d in dds)

        wait_for(all_ready, timeout_s=180.0, interval_s=1.0, what=f"deployments Ready in {ns}")
        time.sleep(5.0)  # the controllers' last writes of the rollout
        start, events_before = _apiserver_writes(cc), _event_counts(kube, ns)
        time.sleep(settings.window_s)  # the window the writes are counted over
        end, events_after = _apiserver_writes(cc), _event_counts(kube, ns)
        emitted = increase(events_before, events_after)
        delta = {k: v for k, v in increase(start, end).items() if k != "events"}
        # Events have many writers (the endpoint controllers keep failing on kwok's loopback pod IPs): the
        # operator's are those of its namespace that it reported
        ours = {k: n for k, n in emitted.items() if k.split("/")[0] in OPERATOR_EVENT_SOURCES}
        writes = int(sum(delta.values())) + sum(ours.values())
        if not operator.alive():
            problems.append("the operator exited")
        return CaseResult(
            case="idle-writes",
            done=f"{final.deployments} converged deployments left alone for {settings.window_s:.0f} s",
            figures={
                "dds": final.deployments,
                "window_s": settings.window_s,
                "writes": writes,
                "by_resource": ",".join(f"{k}:{int(v)}" for k, v in sorted(delta.items())) or "-",
                "operator_events": ",".join(f"{k}:{n}" for k, n in sorted(ours.items())) or "-",
                "other_events": sum(emitted.values()) - sum(ours.values()),
                "all_event_writes": int(end.get("events", 0.0) - start.get("events", 0.0)),
            },
            target="0 writes",
            problems=tuple(problems),
            target_met=writes == 0,
        )
    finally:
        operator.stop()
        cc.drop_namespace(ns)


# -- 4b. load: many deployments in many namespaces, one operator -----------------------------------------
@dataclass(frozen=True)
class LoadSettings:
    deployments: int = 500
    namespaces: int = 20
    converge_timeout_s: float = 1200.0
    idle_window_s: float = 60.0
    resync_s: float = 60.0  # the operator's default: the idle window sees every deployment resynced
    rss_target_mib: float = 200.0
    settle_timeout_s: float = 300.0
    # a rollout's writes stop for this long before the idle window starts: at 500 deployments a 10 s lull
    # came 1.3 s after convergence while kopf still had creations to record (283 writes followed)
    quiet_s: float = 30.0


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(cc: ChaosCluster, settings: LoadSettings = LoadSettings()) -> CaseResult:
    """``deployments`` small deployments spread over ``namespaces`` namespaces, applied as fast as the
    API server takes them, under one operator watching the whole cluster: the time until
    every one has converged, the operator's resident memory (peak, sampled every 0.5 s, and after),
    then, with nothing changing for ``idle_window_s``, the writes the API server counts on the operator's
    objects (no other writer of those runs) and the operator's CPU. Idle writes are a hot loop: 0."""
    kube = cc.kube
    cc.wait_namespaces_gone()
    prefix = f"chaos-load-{uuid.uuid4().hex[:4]}"
    namespaces = [cc.namespace(prefix) for _ in range(settings.namespaces)]
    # cluster-wide, as the chart runs it by default (watch.scope "cluster"): one watch per kind, where a
    # namespace glob opened one per kind and namespace (403 MiB peak at 500 deployments against 309)
    operator = cc.operator(
        f"{prefix}-*", "operator-load.log", ["--all-namespaces", "--resync-interval", str(settings.resync_s)]
    )
    pid = operator.process.pid
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            rss = _rss_mib(pid)
            if rss is not None:
                samples.append(rss)

    sampler = threading.Thread(target=sample, name="load-rss", daemon=True)
    sampler.start()
    problems: list[str] = []
    try:
        rss_start = _rss_mib(pid) or 0.0
        started = time.monotonic()
        for i in range(settings.deployments):
            apply_deployment(kube, small_deployment(namespaces[i % len(namespaces)], f"load-{i:03d}", "h200"))
        applied_s = time.monotonic() - started
        deadline = started + settings.converge_timeout_s
        finals: list[Survey] = []
        for ns in namespaces:
            try:
                finals.append(wait_settled(kube, ns, max(deadline - time.monotonic(), 1.0)))
            except WaitTimeout as timeout:
                finals.append(survey(kube, ns))
                problems.append(str(timeout))
        converge_s = time.monotonic() - started
        settle_s = _wait_quiet(cc, settings.quiet_s, settings.settle_timeout_s)
        by_before, cpu_before = _spec_writes_by_resource(cc), _cpu_s(pid)
        time.sleep(settings.idle_window_s)
        by_after = _spec_writes_by_resource(cc)
        by_resource = increase(by_before, by_after)
        idle_writes = sum(by_resource.values())
        idle_cpu = _cpu_s(pid) - cpu_before
        stop.set()
        sampler.join(2.0)
        rss_end = _rss_mib(pid) or 0.0
        converged = sum(f.converged for f in finals)
        duplicates = sum(f.duplicates for f in finals)
        orphans = sum(f.orphans for f in finals)
        if converged != settings.deployments:
            problems.append(f"{converged} of {settings.deployments} converged")
        if duplicates or orphans:
            problems.append(f"{duplicates} duplicate, {orphans} orphaned children")
        if not operator.alive():
            problems.append("the operator exited")
        peak = max(samples, default=rss_end)
        per_min = idle_writes * 60.0 / settings.idle_window_s
        return CaseResult(
            case="load",
            done=f"{settings.deployments} deployments in {settings.namespaces} namespaces under one operator "
            f"(resync {settings.resync_s:.0f} s), then {settings.idle_window_s:.0f} s with nothing changing",
            figures={
                "dds": settings.deployments,
                "namespaces": settings.namespaces,
                "applied_s": applied_s,
                "converged": converged,
                "converge_s": converge_s,
                "quiet_after_s": settle_s,
                "rss_start_mib": rss_start,
                "rss_peak_mib": peak,
                "rss_idle_mib": rss_end,
                "idle_writes_per_min": per_min,
                "idle_writes_by": ",".join(f"{k}:{int(v)}" for k, v in sorted(by_resource.items())) or "-",
                "idle_cpu_share": idle_cpu / settings.idle_window_s,
            },
            target=f"every DD converged, RSS <= {settings.rss_target_mib:.0f} MiB, 0 writes while idle",
            problems=tuple(problems),
            target_met=not problems and peak <= settings.rss_target_mib and idle_writes == 0,
        )
    finally:
        stop.set()
        operator.stop()
        for ns in namespaces:
            cc.drop_namespace(ns)


# -- 4c. apply -> all children, one deployment at a time ---------------------------------------------------
@dataclass(frozen=True)
class ApplyLatencySettings:
    runs: int = 5  # a fresh operator each: the issue asks for the spread of 5 runs
    applies: int = 30
    timeout_s: float = 60.0


def apply_latency(cc: ChaosCluster, settings: ApplyLatencySettings = ApplyLatencySettings()) -> CaseResult:
    """One small deployment (13 children) applied at a time under an operator of its namespace, the time
    until the API server has announced every child on a watch (:mod:`disagg.chaos.latency`), deleted and
    settled before the next; ``runs`` fresh operators of ``applies`` each. Each run's p99 without its
    first apply is judged against the 300 ms target: the first meets an operator just started (runs of
    72-84 ms p50 had first applies up to 1.1 s here, cause not found: on a warm control plane 8 runs gave
    88-124 ms, applied at once or 3 s after the operator went live), which a long-running operator's
    users do not see; each run's first apply and the p99 with it are printed too. An apply whose
    children never all come, a traceback, or a deleted deployment the operator keeps is a problem."""
    kube = cc.kube
    cc.wait_namespaces_gone()
    ns = cc.namespace("chaos-latency")
    runs: list[LatencyRun] = []
    problems: list[str] = []
    try:
        for r in range(settings.runs):
            operator = cc.operator(ns, f"operator-latency-{r}.log")
            offset = operator.log_size()
            samples: list[float] = []
            try:
                with ChildWatch(kube, ns) as watch:
                    for i in range(settings.applies):
                        name = f"latency-{r}-{i:02d}"
                        elapsed = time_apply(
                            kube, tiny_deployment_manifest(name, ns), watch, settings.timeout_s, FIELD_MANAGER
                        )
                        if elapsed is None:
                            problems.append(f"{name}: children missing after {settings.timeout_s:.0f} s")
                        else:
                            samples.append(elapsed * 1000)
                        kube.delete(DISAGG_DEPLOYMENT, ns, name)
                        if not settle(kube, ns, settings.timeout_s):
                            problems.append(f"{name}: its children and pods not gone after deletion")
                if not wait_deleted(kube, ns, settings.timeout_s):
                    problems.append(f"run {r + 1}: deleted deployments still held by the operator")
                problems.extend(f"traceback: {t}" for t in tracebacks(operator.log_since(offset)))
            finally:
                operator.stop()
            if samples:
                runs.append(LatencyRun(samples))
    finally:
        cc.drop_namespace(ns)
    if not runs:
        return CaseResult("apply-latency", "(no apply measured)", {}, "-", tuple(problems) or ("no runs",))
    p50s, p99s = [run.q(50) for run in runs], [run.q(99) for run in runs]
    rest = [run.q_after_first(99) for run in runs]
    return CaseResult(
        case="apply-latency",
        done=(
            f"{settings.runs} fresh operators x {settings.applies} applies of one deployment "
            "(13 children), each deleted and settled before the next"
        ),
        figures={
            "p50_ms": f"{min(p50s):.0f}-{max(p50s):.0f}",
            "p99_ms": f"{min(p99s):.0f}-{max(p99s):.0f}",
            "p99_after_first_ms": f"{min(rest):.0f}-{max(rest):.0f}",
            "first_ms": ",".join(f"{run.samples_ms[0]:.0f}" for run in runs),
            "max_ms": round(max(max(run.samples_ms) for run in runs)),
        },
        target=f"p99 <= {P99_TARGET_MS:.0f} ms in every run, its operator's first apply aside",
        problems=tuple(problems),
        target_met=max(rest) <= P99_TARGET_MS,
    )


# -- 6. hostile and broken input, applied to a running operator ------------------------------------------
@dataclass(frozen=True)
class HostileSettings:
    deployments: int = 60
    seed: int = 13  # the test and the bench draw the same objects; --seed in neither (change it here)
    settle_timeout_s: float = 120.0
    quiet_s: float = 15.0  # the rollout's writes stop for this long (at most settle_timeout_s) first
    quiet_window_s: float = 30.0
    delete_timeout_s: float = 60.0
    kopf_bytes_limit: int = 16 * 1024  # what kopf keeps in annotations, per object (etcd's cap: 1.5 MiB)


def _names_a_field(message: str) -> bool:
    """Whether a refusal names the field: its path (spec.prefill.replicas), or for a value the API server
    can't decode at all, e.g. metadata.name: {}, the Go field (ObjectMeta.name)."""
    return any(part in message for part in ("spec.", "metadata.", "spec:", "ObjectMeta."))


def _kopf_bytes(obj: Mapping[str, Any]) -> int:
    """Bytes of what kopf keeps on the object (its annotations)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return sum(len(k) + len(str(v)) for k, v in annotations.items() if "kopf" in k or "disagg.dev/" in k)


def _handled(obj: Mapping[str, Any]) -> str | None:
    """'ready', 'degraded:<reason>' or 'waiting:<Ready's reason>' once the operator has reported on the
    object's generation."""
    generation = (obj.get("metadata") or {}).get("generation")
    conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
    degraded = conditions.get("Degraded")
    if degraded is None or degraded.get("observedGeneration") != generation:
        return None
    if degraded.get("status") == "True":
        return f"degraded:{degraded.get('reason')}"
    ready = conditions.get("Ready") or {}
    return "ready" if ready.get("status") == "True" else f"waiting:{ready.get('reason')}"


def _workloads(kube: KubeApi, namespace: str, name: str) -> list[JsonDict]:
    """The deployment's Deployments and LeaderWorkerSets (none of the latter where LWS is not installed)."""
    found: list[JsonDict] = []
    for kind in (DEPLOYMENT, LEADERWORKERSET):
        with contextlib.suppress(ApiException):  # an optional kind whose CRD is not installed
            found.extend(kube.list(kind, namespace, label_selector=f"{DEPLOYMENT_LABEL}={name}"))
    return found


SECRET = Kind("v1", "Secret", "secrets")  # the case's own (the operator can't read Secrets)
CANARY_SECRET = "hf-canary"


def _own_claim_and_canary(obj: dict[str, Any], mutations: list[hostile.Mutation], claim: str) -> None:
    """Give a hostile object a model cache claim of its own (objects sharing a created claim would fight
    over it, as in example_deployment) and its Hugging Face source the canary Secret, where the mutations
    left those fields alone and in shape."""
    touched = {path[:4] for path, _ in mutations} | {path[:3] for path, _ in mutations}
    model = (obj.get("spec") or {}).get("model")
    if not isinstance(model, dict):
        return
    cache = model.get("cache")
    if isinstance(cache, dict) and ("spec", "model", "cache") not in touched:
        cache["claimName"] = claim
    source = model.get("source")
    hugging_face = source.get("huggingFace") if isinstance(source, dict) else None
    if isinstance(hugging_face, dict) and ("spec", "model", "source", "huggingFace") not in touched:
        hugging_face["tokenSecretRef"] = {"name": CANARY_SECRET, "key": "token"}


def _canary_leaks(kube: KubeApi, namespace: str, canary: str, log: str) -> tuple[list[str], int, int]:
    """Where the canary token or its base64 appears (the operator's log, every Event, deployment, child
    and pod of ``namespace``), how many places were searched, and how many containers take HF_TOKEN
    from the canary Secret (none: the search proves nothing)."""
    encoded = base64.b64encode(canary.encode()).decode()
    places = {"operator log": log}
    token_refs = 0
    for kind in (*CHILD_KINDS, DISAGG_DEPLOYMENT, EVENT, POD):
        with contextlib.suppress(ApiException):  # an optional kind whose CRD is not installed
            for found in kube.list(kind, namespace):
                places[f"{found['kind']}/{found['metadata']['name']}"] = json.dumps(found)
                if kind is POD:
                    token_refs += sum(
                        (env.get("valueFrom") or {}).get("secretKeyRef", {}).get("name") == CANARY_SECRET
                        for container in (found.get("spec") or {}).get("containers", [])
                        for env in container.get("env", [])
                    )
    leaks = [where for where, text in places.items() if canary in text or encoded in text]
    return leaks, len(places), token_refs


def hostile_input(cc: ChaosCluster, settings: HostileSettings = HostileSettings()) -> CaseResult:
    """``deployments`` hostile DisaggregatedDeployments (:mod:`disagg.chaos.hostile`, seeded) created for
    real in one namespace under a running operator. Each must end one of three ways: refused by the API
    server with a message naming the field; Degraded, the operator saying why; or rendered, its children
    accepted and what the operator owns still its own (one KV-transfer flag, HF_TOKEN from the Secret,
    one in-memory dshm). Each names a canary Secret for its Hugging Face token, which must appear in no
    log line, Event, status, child or pod (pods must take it by reference). Then, with nothing changing,
    the writes the API server counts on the operator's objects over ``quiet_window_s`` (a retry storm is
    writes), what kopf keeps on each object, and every object deleted and gone. A refusal naming no
    field, an object never reported on, a traceback, an operator exit, an owned field taken or an object
    that can't be deleted is a problem."""
    kube = cc.kube
    cc.wait_namespaces_gone()
    ns = cc.namespace("chaos-hostile")
    operator = cc.operator(ns, "operator-hostile.log")
    offset = operator.log_size()
    rng = random.Random(settings.seed)
    canary = f"hf_canary_{ns[-6:]}_do_not_log"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": CANARY_SECRET}}
    kube.create(SECRET, ns, {**secret, "stringData": {"token": canary}})
    problems: list[str] = []
    refused = 0
    accepted: dict[str, str] = {}  # stored name -> the mutations, for the messages
    try:
        for i in range(settings.deployments):
            obj, mutations = hostile.hostile_deployment(rng)
            shown = hostile.describe(mutations)
            metadata = obj.setdefault("metadata", {})
            if not any(path == ("metadata", "name") for path, _ in mutations):
                metadata["name"] = f"hostile-{i:03d}"
            metadata["namespace"] = ns
            _own_claim_and_canary(obj, mutations, f"hostile-{i:03d}-weights")
            try:
                stored = kube.create(DISAGG_DEPLOYMENT, ns, obj)
            except ApiException as error:
                message = api_message(error)
                if error.status not in (400, 409, 422):
                    problems.append(f"#{i}: HTTP {error.status} {message[:160]} ({shown})")
                elif error.status != 409 and not _names_a_field(message):
                    problems.append(f"#{i}: refusal names no field: {message[:160]} ({shown})")
                refused += 1
                continue
            accepted[stored["metadata"]["name"]] = shown

        outcomes: dict[str, str] = {}

        def reported() -> bool:
            for dd in kube.list(DISAGG_DEPLOYMENT, ns):
                outcome = _handled(dd)
                if outcome is not None:
                    outcomes[dd["metadata"]["name"]] = outcome
            return accepted.keys() <= outcomes.keys()

        with contextlib.suppress(WaitTimeout):
            wait_for(reported, timeout_s=settings.settle_timeout_s, interval_s=1.0, what="reports")
        problems.extend(
            f"{name}: never reported on ({accepted[name]})" for name in sorted(accepted.keys() - outcomes)
        )
        for name, outcome in sorted(outcomes.items()):
            if outcome.startswith("degraded"):
                continue
            dd = kube.get(DISAGG_DEPLOYMENT, ns, name) or {}
            engine = str(((dd.get("spec") or {}).get("engine") or {}).get("type", "vllm"))
            taken = hostile.owned_field_problems(_workloads(kube, ns, name), engine)
            problems.extend(f"{name}: {p} ({accepted[name]})" for p in taken)

        leaks, searched, token_refs = _canary_leaks(kube, ns, canary, operator.log_since(offset))
        problems.extend(f"the Secret's token appears in {where}" for where in leaks)
        if accepted and not token_refs:
            problems.append("no pod takes HF_TOKEN from the canary Secret: the leak search proves nothing")

        settle_s = _wait_quiet(cc, settings.quiet_s, settings.settle_timeout_s)
        before = _spec_writes_by_resource(cc)
        time.sleep(settings.quiet_window_s)
        after = _spec_writes_by_resource(cc)
        quiet = writes_between(before, after)
        quiet_writes = sum(quiet.values())
        kopf_bytes = max((_kopf_bytes(d) for d in kube.list(DISAGG_DEPLOYMENT, ns)), default=0)
        if kopf_bytes > settings.kopf_bytes_limit:
            problems.append(
                f"kopf keeps {kopf_bytes} bytes on one object (limit {settings.kopf_bytes_limit})"
            )

        for name in accepted:
            with contextlib.suppress(ApiException):
                kube.delete(DISAGG_DEPLOYMENT, ns, name)
        with contextlib.suppress(WaitTimeout):
            wait_for(
                lambda: not kube.list(DISAGG_DEPLOYMENT, ns),
                timeout_s=settings.delete_timeout_s,
                interval_s=0.5,
                what="deletions",
            )
        stuck = [d["metadata"]["name"] for d in kube.list(DISAGG_DEPLOYMENT, ns)]
        problems.extend(f"{name}: not deleted after {settings.delete_timeout_s:.0f} s" for name in stuck)
        log = operator.log_since(offset)
        problems.extend(f"traceback: {t}" for t in tracebacks(log))
        if not operator.alive():
            problems.append("the operator exited")
    finally:
        operator.stop()
        cc.drop_namespace(ns)
    counts = {
        k: sum(v.split(":")[0] == k for v in outcomes.values()) for k in ("ready", "degraded", "waiting")
    }
    reasons = collections.Counter(v for v in outcomes.values() if ":" in v)
    return CaseResult(
        case="hostile-input",
        done=(
            f"{settings.deployments} hostile deployments (seed {settings.seed}) created under a running "
            f"operator, left {settings.quiet_window_s:.0f} s, deleted"
        ),
        figures={
            "refused": refused,
            "accepted": len(accepted),
            **counts,
            "reasons": ",".join(f"{k}x{n}" for k, n in sorted(reasons.items())) or "-",
            "unreported": len(accepted.keys() - outcomes.keys()),
            "settled_s": round(settle_s, 1),
            "quiet_writes": quiet_writes,
            "quiet_by_resource": ",".join(f"{k}:{n}" for k, n in sorted(quiet.items())) or "-",
            "kopf_bytes_max": kopf_bytes,
            "token_refs": token_refs,
            "places_searched": searched,
            "token_leaks": len(leaks),
            "undeletable": len(stuck),
        },
        target="each refused naming a field, Degraded saying why, or applied; 0 leaks; 0 quiet writes",
        problems=tuple(problems),
        target_met=quiet_writes == 0,
    )


# -- 5. scale-downs under streaming traffic through the router ------------------------------------------
# steady chat through the released router, long streams (256 tokens) so many are in flight at a cut
STEADY_CHAT = Phase("steady", 60.0, 4.0, 300, 256)


@dataclass(frozen=True)
class ScaleDownSettings:
    start: tuple[int, int] = (2, 3)  # prefill, decode
    end: tuple[int, int] = (1, 1)
    phase: Phase = STEADY_CHAT
    decode_down_at_s: float = 15.0  # seconds into the traffic
    prefill_down_at_s: float = 30.0
    decode_pre_stop_s: int = 30  # the decode pods' preStop sleep (spec.decode.preStopSleepSeconds)
    drain_s: float = 20.0  # after the last arrival, for the streams in flight to end
    gpu_type: str = "h100"
    settle_timeout_s: float = 90.0


@dataclass(frozen=True)
class Moment:
    """A scale-down: the role patched, when (time.monotonic())."""

    what: str  # the role scaled down
    at: float


def streams_across(report: PhaseReport, moments: list[Moment]) -> list[tuple[Moment, float, float]]:
    """Each request in flight when a scale-down began (sent before, answered after): the first such
    moment, its duration and how long after that moment it ended."""
    found: list[tuple[Moment, float, float]] = []
    for result in report.load.results:
        if result.sent_at is None or result.done_at is None:
            continue
        for moment in moments:
            if result.sent_at < moment.at < result.done_at:
                found.append((moment, result.done_at - result.sent_at, result.done_at - moment.at))
                break
    return found


def _pods(kube: KubeApi, namespace: str, deployment: str, role: str) -> list[JsonDict]:
    selector = f"disagg.dev/deployment={deployment},disagg.dev/role={role}"
    return kube.list(POD, namespace, selector)


def scale_down_drain(cc: ChaosCluster, settings: ScaleDownSettings = ScaleDownSettings()) -> CaseResult:
    """A deployment without autoscaling at 2:3 serving steady chat through the released vllm-router
    (emulated engines of the live twin, which serve through a removed pod's preStop sleep and drain), scaled
    down during the traffic: decode 3 -> 1, then prefill 2 -> 1 (merge patches of its spec). Every request
    must complete (none failed, none cut off) and the pools must end at 1:1 with no pod left Terminating.
    Figures: what became of the requests, and the streams that were in flight when a scale-down began (how
    many, the longest one, the latest end after its scale-down)."""
    kube = cc.kube
    ns = cc.namespace("chaos-scale-down")
    workdir = cc.workdir / "scale-down-drain"
    (prefill, decode), (prefill_end, decode_end) = settings.start, settings.end
    demo = DemoSettings(
        namespace=ns,
        deployment="chat",
        gpu_type=settings.gpu_type,
        model_cache_claim=None,
        prefill_replicas=prefill,
        decode_replicas=decode,
        decode_pre_stop_s=settings.decode_pre_stop_s,
        drain_s=settings.drain_s,
        phases=(settings.phase,),
        report_dir=workdir / "report",
    )
    (port,) = free_ports(1)
    loop = ClosedLoop(cc.info, demo, RunSettings(operator_metrics_port=port, log_dir=workdir / "logs"), kube)
    try:
        loop.start_operator()  # no Prometheus: nothing autoscales
        dd = deployment_manifest(demo)
        dd["spec"].pop("autoscaling")
        apply_object(kube, dd, FIELD_MANAGER)
        wait_until(loop.children_ready, 120, "the deployment's children")
        loop.start_twin()
        url = loop.start_router()  # once the router routes to all 2 + 3 engines
        reports: list[PhaseReport] = []
        traffic = threading.Thread(
            target=lambda: reports.extend(run_traffic(url, demo)), name="scale-down-traffic", daemon=True
        )
        started = time.monotonic()
        traffic.start()
        moments: list[Moment] = []
        for at, role, count in (
            (settings.decode_down_at_s, "decode", decode_end),
            (settings.prefill_down_at_s, "prefill", prefill_end),
        ):
            time.sleep(max(0.0, started + at - time.monotonic()))  # the scale-down's moment in the traffic
            patch_spec(kube, ns, demo.deployment, {role: {"replicas": count}})
            moments.append(Moment(role, time.monotonic()))
        traffic.join(timeout=settings.phase.duration_s + settings.drain_s + 60.0)
        problems: list[str] = []
        if traffic.is_alive() or not reports:
            problems.append("the traffic did not finish")
        report = reports[0] if reports else PhaseReport(settings.phase.name, 0, LoadReport())

        def at_end() -> bool:
            for role, count in (("prefill", prefill_end), ("decode", decode_end)):
                if child_replicas(kube, ns, f"{demo.deployment}-{role}") != count:
                    return False
                if len(_pods(kube, ns, demo.deployment, role)) != count:  # Terminating ones included
                    return False
            return True

        try:
            wait_for(at_end, settings.settle_timeout_s, 1.0, f"the pools at {prefill_end}:{decode_end}")
        except WaitTimeout as timeout:
            problems.append(str(timeout))
        pools = "/".join(str(len(_pods(kube, ns, demo.deployment, role))) for role in ("prefill", "decode"))
        if report.failed:
            errors = ", ".join(f"{n} x {e}" for e, n in report.errors().items())
            problems.append(f"{report.failed} requests failed ({errors}); logs: {loop.run.log_dir}")
        if report.cut_off:
            problems.append(f"{report.cut_off} requests cut off (still running after the drain)")
        across = streams_across(report, moments)
        by_moment = {m.what: sum(1 for a in across if a[0] is m) for m in moments}
        return CaseResult(
            case="scale-down-drain",
            done=(
                f"scaled a {prefill}:{decode} deployment (no autoscaling) to {prefill_end}:{decode_end} "
                f"under steady chat through vllm-router ({settings.phase.rate_rps:g} req/s, "
                f"{settings.phase.output_tokens}-token streams): decode at "
                f"{settings.decode_down_at_s:.0f} s, prefill at {settings.prefill_down_at_s:.0f} s"
            ),
            figures={
                "sent": report.sent,
                "ok": report.ok,
                "failed": report.failed,
                "cut_off": report.cut_off,
                "errors": ",".join(f"{e}:{n}" for e, n in report.errors().items()) or "-",
                "in_flight_at_cuts": ",".join(f"{k}:{n}" for k, n in by_moment.items()),
                "longest_across_s": max((a[1] for a in across), default=0.0),
                "last_end_after_cut_s": max((a[2] for a in across), default=0.0),
                "pods_at_end": pools,
            },
            target="0 lost, 0 cut off, 0 errored; pools end at 1:1",
            problems=tuple(problems),
        )
    finally:
        loop.stop()
        cc.drop_namespace(ns)


CASES: dict[str, Callable[[ChaosCluster], CaseResult]] = {
    "operator-killed": operator_killed,
    "operator-killed-autoscaling": operator_killed_autoscaling,
    "apiserver-outage": apiserver_outage,
    "ha-failover": ha_failover,
    "etcd-outage": etcd_outage,
    "prometheus-outage": prometheus_outage,
    "prometheus-garbage": prometheus_garbage,
    "idle-writes": idle_writes,
    # before load: run after it, apply-latency's first deletion was not settled within 60 s (the garbage
    # collector deletes the children, and load's 500 deployments had just been deleted)
    "apply-latency": apply_latency,
    "hostile-input": hostile_input,
    "load": load,
    "scale-down-drain": scale_down_drain,
}
