"""What the chaos cases run on: a local control plane of their own (so a session's shared cluster is never
disturbed), the operator as its own process (which a case may SIGKILL), and the accounting of a namespace's
DisaggregatedDeployments and their children: which converged, which children are extra (duplicates), missing
or left without a live owner (orphans)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from disagg.api.deployment import DisaggregatedDeployment
from disagg.cluster.local import ClusterInfo, ClusterSettings, LocalCluster, free_ports
from disagg.cluster.wait import wait_for
from disagg.k8s.apply import DEPLOYMENT_LABEL
from disagg.k8s.client import (
    CHILD_KINDS,
    DISAGG_DEPLOYMENT,
    MERGE_PATCH,
    JsonDict,
    Kind,
    KubeApi,
    load_api_client,
)
from disagg.k8s.crds import install_crds
from disagg.render import render_children

NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
FIELD_MANAGER = "disagg-chaos"
OPERATOR_START_TIMEOUT_S = 90.0
OPERATOR_STOP_TIMEOUT_S = 15.0
# the resync safety net of the operators the cases run (as the integration tests': a missed event heals)
RESYNC_INTERVAL_S = 20
TRACEBACK = "Traceback (most recent call last)"

Figure = int | float | str


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome: what was done to the system, what it measured, the target, and the correctness
    problems found (none: passed). Figures are printed, never asserted on; problems are."""

    case: str
    done: str
    figures: Mapping[str, Figure]
    target: str
    problems: tuple[str, ...] = ()
    target_met: bool = True

    @property
    def passed(self) -> bool:
        return not self.problems

    def line(self) -> str:
        figures = " ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        verdict = "pass" if self.passed else "FAIL: " + "; ".join(self.problems)
        return f"chaos {self.case}: {figures} (target {self.target}) {verdict}"

    def json_line(self) -> str:
        return json.dumps(
            {
                "case": self.case,
                "done": self.done,
                "figures": dict(self.figures),
                "target": self.target,
                "target_met": self.target_met,
                "problems": list(self.problems),
            },
            sort_keys=True,
        )


def _fmt(value: Figure) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


@dataclass
class OperatorRun:
    """``disagg run --standalone --namespace NS`` as a child process, its output in ``log_path`` (peered
    instead of standalone when ``extra_args`` name a ``--peering``, cluster-wide when they say
    ``--all-namespaces``)."""

    process: subprocess.Popen[bytes]
    log_path: Path
    liveness_url: str

    @classmethod
    def start(
        cls,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> OperatorRun:
        (port,) = free_ports(1)
        liveness = f"http://127.0.0.1:{port}/healthz"
        command = [
            sys.executable,
            "-m",
            "disagg",
            "run",
            *(() if "--all-namespaces" in extra_args else ("--namespace", namespace)),
            *(() if "--peering" in extra_args else ("--standalone",)),
            "--liveness-endpoint",
            liveness,
            "--resync-interval",
            str(RESYNC_INTERVAL_S),
            *extra_args,
        ]
        environment = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environment
            )
        return cls(process, log_path, liveness)

    def alive(self) -> bool:
        return self.process.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.liveness_url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_live(self, timeout_s: float = OPERATOR_START_TIMEOUT_S) -> None:
        def live() -> bool:
            if not self.alive():
                raise RuntimeError(f"the operator exited with {self.process.returncode}:\n{self.log_tail()}")
            return self.healthy()

        wait_for(live, timeout_s=timeout_s, what=f"the operator's liveness endpoint ({self.log_path})")

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as when a node dies or the OOM killer strikes."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(OPERATOR_STOP_TIMEOUT_S)

    def stop(self) -> None:
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(OPERATOR_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(offset)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, size: int = 6000) -> str:
        return self.log_since(max(0, self.log_size() - size))


def tracebacks(log: str) -> list[str]:
    """The last line (the exception) of every Python traceback in ``log``."""
    found: list[str] = []
    lines = log.splitlines()
    for index, line in enumerate(lines):
        if TRACEBACK not in line:
            continue
        last = ""
        for following in lines[index + 1 :]:
            if following.startswith((" ", "\t")) or not following.strip():
                continue
            last = following.strip()
            if not re.match(r"^(During handling|The above exception)", last):
                break
        found.append(last[:200])
    return found


@dataclass
class ChaosCluster:
    """A local control plane of its own under ``workdir``, the CRDs installed, and the operators started
    on it (stopped by :meth:`close`)."""

    workdir: Path
    local: LocalCluster
    info: ClusterInfo
    kube: KubeApi
    operators: list[OperatorRun] = field(default_factory=list)

    @classmethod
    def start(cls, workdir: Path) -> ChaosCluster:
        local = LocalCluster(state_dir=workdir / "cluster", settings=ClusterSettings(tie_to_parent=True))
        try:
            info = local.up()
            kube = KubeApi(load_api_client(info.kubeconfig))
            install_crds(kube, field_manager=FIELD_MANAGER)
        except BaseException:
            local.down(keep_state=True)
            raise
        return cls(workdir, local, info, kube)

    def close(self) -> None:
        try:
            for operator in self.operators:
                operator.stop()
        finally:
            self.local.down(keep_state=True)  # logs stay under workdir

    def namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.kube.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            FIELD_MANAGER,
            kind=NAMESPACE,
        )

        def default_service_account() -> bool:  # pods are admitted once the controller-manager made it
            try:
                self.kube.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
            except ApiException as error:
                if error.status == 404:
                    return False
                raise
            return True

        wait_for(default_service_account, what=f"ServiceAccount default in {name}")
        return name

    def drop_namespace(self, name: str) -> None:
        """Delete a case's namespace once its operator is stopped (not waited for). The finalizers kopf put
        on the deployments are removed first: no operator will release them, and the namespace controller
        would otherwise retry deleting the namespace's contents forever (writes that later cases count)."""
        for dd in self.kube.list(DISAGG_DEPLOYMENT, name):
            if dd["metadata"].get("finalizers"):
                with contextlib.suppress(ApiException):  # gone meanwhile
                    self.kube.request(
                        "PATCH",
                        DISAGG_DEPLOYMENT.path(name, dd["metadata"]["name"]),
                        body={"metadata": {"finalizers": None}},
                        content_type=MERGE_PATCH,
                    )
        self.kube.delete(NAMESPACE, None, name)

    def wait_namespaces_gone(self, timeout_s: float = 120.0) -> None:
        """Until no namespace is Terminating (the cases' earlier namespaces are gone)."""

        def gone() -> bool:
            return not any(
                (ns.get("status") or {}).get("phase") == "Terminating"
                for ns in self.kube.list(NAMESPACE, None)
            )

        wait_for(gone, timeout_s=timeout_s, interval_s=1.0, what="the earlier cases' namespaces deleted")

    def operator(
        self,
        namespace: str,
        log_name: str,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> OperatorRun:
        """Start an operator for ``namespace`` and wait until it is live."""
        run = OperatorRun.start(
            self.info.kubeconfig, namespace, self.workdir / "logs" / log_name, extra_args, env
        )
        self.operators.append(run)
        run.wait_live()
        return run


# -- accounting ---------------------------------------------------------------------------------------
ChildKey = tuple[str, str]  # (kind, name)


def expected_children(obj: Mapping[str, Any]) -> set[ChildKey]:
    """What the renderer says a deployment's children are (the pure function the operator uses too)."""
    dd = DisaggregatedDeployment.model_validate(obj)
    return {(c["kind"], c["metadata"]["name"]) for c in render_children(dd)}


def _dd_owner(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == DISAGG_DEPLOYMENT.kind and ref.get("controller"):
            return str(ref.get("uid"))
    return None


@dataclass(frozen=True)
class Survey:
    """A namespace's deployments and children at one moment."""

    deployments: int  # live (not being deleted)
    converged: int  # exactly the rendered children and status.observedGeneration == generation
    terminating: tuple[str, ...]  # deployments being deleted (a finalizer not yet released)
    duplicates: int  # children owned by a live deployment that its rendering does not name
    missing: int  # rendered children that do not exist
    orphans: int  # children of the deployment label whose owner is no live deployment (or none)
    stale: tuple[str, ...]  # deployments whose status describes an older generation

    @property
    def settled(self) -> bool:
        return (
            self.converged == self.deployments
            and not self.terminating
            and not self.duplicates
            and not self.orphans
        )


def survey(kube: KubeApi, namespace: str) -> Survey:
    dds = kube.list(DISAGG_DEPLOYMENT, namespace)
    live = {str(d["metadata"]["uid"]): d for d in dds if not d["metadata"].get("deletionTimestamp")}
    terminating = tuple(sorted(d["metadata"]["name"] for d in dds if d["metadata"].get("deletionTimestamp")))
    owned: dict[str, set[ChildKey]] = {uid: set() for uid in live}
    orphans = 0
    for kind in CHILD_KINDS:
        for child in kube.list(kind, namespace):
            owner = _dd_owner(child)
            labelled = DEPLOYMENT_LABEL in ((child.get("metadata") or {}).get("labels") or {})
            if owner is None:
                orphans += int(labelled)
            elif owner in live:
                owned[owner].add((child["kind"], child["metadata"]["name"]))
            else:
                orphans += 1
    duplicates = missing = converged = 0
    stale: list[str] = []
    for uid, dd in live.items():
        want = expected_children(dd)
        have = owned[uid]
        duplicates += len(have - want)
        missing += len(want - have)
        current = (dd.get("status") or {}).get("observedGeneration") == dd["metadata"].get("generation")
        if not current:
            stale.append(dd["metadata"]["name"])
        converged += int(current and have == want)
    return Survey(len(live), converged, terminating, duplicates, missing, orphans, tuple(sorted(stale)))


def apply_deployment(kube: KubeApi, obj: Mapping[str, Any]) -> JsonDict:
    return kube.apply(obj, FIELD_MANAGER, kind=DISAGG_DEPLOYMENT)
