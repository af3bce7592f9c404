"""Shared pytest fixtures: the local control plane (real components) and Prometheus.

Tests under tests/integration are marked ``integration``, those under tests/e2e ``e2e`` and those under
tests/chaos ``chaos`` (they start a control plane of their own: ``control_plane_programs``). When any such
test is selected, the control-plane programs are obtained (built on first use) before the first test runs,
so a cold build is not cut short by a test's timeout; without a Go toolchain those tests fail with a message
saying so (they are never skipped).

Fixtures: ``cluster`` (session ClusterInfo), ``kubeconfig`` (Path), ``k8s_api`` (kubernetes ApiClient),
``namespace`` (a fresh namespace per test, deleted after), ``prometheus_factory`` (start Prometheus with a
config dict; stopped after the test), ``bench_module`` (load a script under bench/ as a module). A failing
test that used the cluster gets the end of every component's log attached to its report.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from disagg.cluster.binaries import BinaryError, ensure_all
from disagg.cluster.local import ClusterError, ClusterInfo, ClusterSettings, LocalCluster
from disagg.cluster.prometheus import PrometheusProcess, PrometheusSettings, start_prometheus
from disagg.cluster.wait import wait_for

# Property tests judge behaviour, not speed: no per-example deadline and no health check on slow example
# generation, either of which a loaded machine trips (no timed assertions in tests; speed is bench/'s)
settings.register_profile("disagg", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("disagg")

CONTROL_PLANE_PROGRAMS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "lws-controller",
    "helm",
    "prometheus",
    "registry",  # the OCI registry the chart test pushes the packaged charts to
    "prometheus-adapter",  # the external metrics API the HPA e2e scales through (tests/e2e/test_hpa_scale.py)
)
_CLUSTER_KEY = pytest.StashKey[LocalCluster]()
_BINARY_ERROR_KEY = pytest.StashKey[str]()
_PROMETHEUS_KEY = pytest.StashKey[list[PrometheusProcess]]()
_LOG_TAIL_BYTES = 4000
_AUTO_MARKS = {"integration": "integration", "e2e": "e2e", "chaos": "chaos"}


@pytest.fixture(scope="session")
def bench_module() -> Callable[[str], ModuleType]:
    """Load ``bench/<name>.py`` as the module ``name`` (the bench scripts are not a package), once."""
    root = Path(__file__).resolve().parents[1]

    def load(name: str) -> ModuleType:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, root / "bench" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses resolve their annotations through it
        spec.loader.exec_module(module)
        return module

    return load


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        try:
            top = item.path.relative_to(root).parts[0]
        except ValueError:
            continue
        mark = _AUTO_MARKS.get(top)
        if mark is not None:
            item.add_marker(getattr(pytest.mark, mark))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Obtain the programs once, outside any test's timeout, if a selected test needs them."""
    needs_cluster = any(item.get_closest_marker(m) for item in session.items for m in _AUTO_MARKS.values())
    if not needs_cluster or session.config.option.collectonly:
        return
    try:
        ensure_all(CONTROL_PLANE_PROGRAMS)
    except BinaryError as exc:
        session.config.stash[_BINARY_ERROR_KEY] = str(exc)


def _require_binaries(config: pytest.Config) -> None:
    error = config.stash.get(_BINARY_ERROR_KEY, None)
    if error is not None:
        pytest.fail(f"the local control plane's programs are unavailable: {error}", pytrace=False)


@pytest.fixture(scope="session")
def control_plane_programs(request: pytest.FixtureRequest) -> None:
    """Fails the test when the control plane's programs are unavailable (for tests that start their own)."""
    _require_binaries(request.config)


@pytest.fixture(scope="session")
def local_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    _require_binaries(request.config)
    state_dir = tmp_path_factory.mktemp("cluster")
    lc = LocalCluster(state_dir=state_dir, settings=ClusterSettings(tie_to_parent=True))
    request.config.stash[_CLUSTER_KEY] = lc
    try:
        yield lc
    finally:
        lc.down(keep_state=True)  # logs stay in pytest's temporary directory for inspection


@pytest.fixture(scope="session")
def cluster(local_cluster: LocalCluster) -> ClusterInfo:
    try:
        return local_cluster.up()
    except (ClusterError, BinaryError) as exc:
        pytest.fail(f"the local control plane did not start: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def kubeconfig(cluster: ClusterInfo) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def k8s_api(cluster: ClusterInfo) -> Iterator[Any]:
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield api
    finally:
        api.close()


def _namespace_name(nodeid: str) -> str:
    test = nodeid.split("::")[-1]
    base = re.sub(r"[^a-z0-9-]+", "-", test.lower()).strip("-")[:40].strip("-") or "test"
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, k8s_api: Any) -> Iterator[str]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(k8s_api)
    name = _namespace_name(request.node.nodeid)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"disagg.dev/test": "true"}))
    )

    def default_service_account() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # pods are admitted only once the controller-manager has made the namespace's default ServiceAccount
    wait_for(default_service_account, what=f"ServiceAccount default in namespace {name}")
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def prometheus_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[dict[str, Any]], PrometheusProcess]]:
    started: list[PrometheusProcess] = []
    request.node.stash[_PROMETHEUS_KEY] = started

    def start(config: dict[str, Any]) -> PrometheusProcess:
        workdir = tmp_path / f"prometheus-{len(started)}"
        prom = start_prometheus(config, workdir, PrometheusSettings(tie_to_parent=True))
        started.append(prom)
        return prom

    try:
        yield start
    finally:
        for prom in started:
            prom.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    fixturenames: list[str] = list(getattr(item, "fixturenames", []))
    lc = item.config.stash.get(_CLUSTER_KEY, None)
    if lc is not None and (
        "cluster" in fixturenames or "local_cluster" in fixturenames or "namespace" in fixturenames
    ):
        for component, tail in lc.component_logs(_LOG_TAIL_BYTES).items():
            report.sections.append((f"{component} log (last {_LOG_TAIL_BYTES} bytes)", tail))
    for index, prom in enumerate(item.stash.get(_PROMETHEUS_KEY, [])):
        report.sections.append((f"prometheus[{index}] log", prom.log_tail(_LOG_TAIL_BYTES)))


DecisionCall = tuple[Any, Any, Any, Any]  # (observation, policy spec, bounds, decision)


@pytest.fixture
def record_decisions(monkeypatch: pytest.MonkeyPatch) -> Callable[[object], list[DecisionCall]]:
    """``record(module)`` replaces ``module.decide`` with :func:`disagg.policy.decide` that also appends
    (observation, policy, bounds, decision) of each call to the list it returns."""
    from disagg.policy import decide

    def record(module: object) -> list[DecisionCall]:
        calls: list[DecisionCall] = []

        def recorded(obs: Any, policy: Any, state: Any, now: float, bounds: Any, **kw: Any) -> Any:
            decision, new_state = decide(obs, policy, state, now, bounds, **kw)
            calls.append((obs, policy, bounds, decision))
            return decision, new_state

        monkeypatch.setattr(module, "decide", recorded)
        return calls

    return record
