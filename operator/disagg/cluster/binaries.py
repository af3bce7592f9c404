"""Obtain the control-plane programs once and cache them under ``~/.cache/disagg/<component>-<version>/``.

The Kubernetes programs, etcd, kwok and helm are built from the Go module proxy through small generated
wrapper modules (``go install`` refuses ``k8s.io/kubernetes`` because its go.mod replaces the staging
modules with local paths). Prometheus is built the same way, with only the Kubernetes service discovery.

Run ``python -m disagg.cluster.binaries [NAME ...]`` to obtain everything (or the named programs) ahead
of time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


class BinaryError(RuntimeError):
    """A program could not be obtained; the message names the component and the failed step."""


@dataclass(frozen=True)
class Versions:
    """Pinned versions of every component (one place to bump them)."""

    # Newest stable release served by proxy.golang.org (`go list -m -versions k8s.io/kubernetes`).
    kubernetes: str = "v1.37.2"
    # k8s.io/kubernetes v1.37.2's go.mod requires go.etcd.io/etcd/client/v3 v3.7.0: the matching server line.
    etcd: str = "v3.7.3"
    kwok: str = "v0.8.0"
    helm: str = "v3.22.0"
    # Go module version v0.3XX.Y is Prometheus 3.XX.Y. Built from source because Debian's package leaves
    # out kubernetes_sd_configs, which the e2e uses to discover engine pods.
    prometheus: str = "v0.316.0"
    # helm-docs (github.com/norwoodj/helm-docs): the chart README's values table from values.yaml's
    # `# --` comments (tests/integration/test_chart.py checks the README is its output).
    helmdocs: str = "v1.14.2"
    # The LeaderWorkerSet controller (sigs.k8s.io/lws), which runs multi-node replicas: the newest release
    # the Go module proxy serves that builds with Go 1.26 (v0.9.0's go.mod says go 1.26.0; its
    # k8s.io/* v0.36 libraries talk to a v1.37 API server).
    lws: str = "v0.9.0"
    # The Prometheus Operator (github.com/prometheus-operator/prometheus-operator): only its CRDs are
    # used (example/prometheus-operator-crd/ of the module), to validate the chart's ServiceMonitor,
    # PodMonitor and PrometheusRule. v0.94.1 is the newest version of the root module the Go module proxy
    # serves here (`go list -m -json ...@v0.95.x` answers 403 "not available"; its pkg/apis/monitoring
    # submodule goes to v0.95.2, but that module ships no CRD manifests).
    prometheus_operator: str = "v0.94.1"
    # Gateway API Inference Extension (sigs.k8s.io/gateway-api-inference-extension): only its
    # InferencePool CRD (inference.networking.k8s.io/v1), to validate what spec.router.type gateway-api
    # renders. v1.6.0 is the newest version whose module the Go module proxy serves here (v1.6.1's .info
    # answers but its .zip is 403; v1.6.2, v1.7.0 and v1.8.0 answer 403).
    gateway_api_inference_extension: str = "v1.6.0"
    # Gateway API (sigs.k8s.io/gateway-api): its standard-channel CRDs (HTTPRoute, Gateway, ...). v1.7.0's
    # go.mod needs a newer Go than the toolchain here; v1.6.3 is the newest v1.6 release it serves.
    gateway_api: str = "v1.6.3"
    # The CNCF distribution registry (github.com/distribution/distribution/v3, cmd/registry): a local OCI
    # registry on 127.0.0.1 that the chart test pushes the packaged charts to (`helm push`) and installs
    # them from (`helm install oci://...`). v3.1.2 is the newest version the Go module proxy serves here.
    registry: str = "v3.1.2"
    # prometheus-adapter (sigs.k8s.io/prometheus-adapter): serves the external metrics API
    # (external.metrics.k8s.io) from the local Prometheus, so the real HPA controller in
    # kube-controller-manager can scale a DisaggregatedDeployment through its /scale subresource. v0.12.0
    # is the newest version the Go module proxy serves here (v0.12.1 and v0.13.0 answer 403).
    prometheusadapter: str = "v0.12.0"
    # KEDA (github.com/kedacore/keda/v2): only its CRDs (config/crd/bases), so the ScaledObject example that
    # targets a DisaggregatedDeployment's /scale is validated by the API server. v2.21.0 is the newest
    # version the Go module proxy lists here.
    keda: str = "v2.21.0"


@dataclass(frozen=True)
class BuildSettings:
    cache_root: Path = field(default_factory=lambda: default_cache_root())
    go: str = "go"
    parallel: int = 2
    versions: Versions = field(default_factory=Versions)
    log: bool = True


def default_cache_root() -> Path:
    env = os.environ.get("DISAGG_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "disagg"


# program name -> component that provides it
COMPONENT_OF: Mapping[str, str] = {
    "kube-apiserver": "kubernetes",
    "kube-controller-manager": "kubernetes",
    "kube-scheduler": "kubernetes",
    "kubectl": "kubernetes",
    "etcd": "etcd",
    "kwok": "kwok",
    "helm": "helm",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "helm-docs": "helmdocs",
    "lws-controller": "lws",
    "registry": "registry",
    "prometheus-adapter": "prometheusadapter",
}

PROGRAMS_OF: Mapping[str, tuple[str, ...]] = {
    "kubernetes": ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
    "etcd": ("etcd",),
    "kwok": ("kwok",),
    "helm": ("helm",),
    "prometheus": ("prometheus", "promtool"),
    "helmdocs": ("helm-docs",),
    "lws": ("lws-controller",),
    "registry": ("registry",),
    "prometheusadapter": ("prometheus-adapter",),
}


def log(settings: BuildSettings, message: str) -> None:
    if settings.log:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        print(f"[disagg {stamp}] {message}", file=sys.stderr, flush=True)


def component_version(settings: BuildSettings, component: str) -> str:
    return str(getattr(settings.versions, component))


def component_dir(settings: BuildSettings, component: str) -> Path:
    return settings.cache_root / f"{component}-{component_version(settings, component)}"


def cached_path(name: str, settings: BuildSettings | None = None) -> Path | None:
    """The cached program, or None if it has not been obtained yet (never builds)."""
    settings = settings or BuildSettings()
    component = _component(name)
    path = component_dir(settings, component) / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ensure_binary(name: str, settings: BuildSettings | None = None) -> Path:
    """Path of program ``name``, building or downloading its component on first use."""
    settings = settings or BuildSettings()
    found = cached_path(name, settings)
    if found is not None:
        return found
    component = _component(name)
    with _component_lock(settings, component):
        found = cached_path(name, settings)
        if found is None:
            _obtain(settings, component)
            found = cached_path(name, settings)
    if found is None:
        raise BinaryError(
            f"{component}: built, but {name} is missing from {component_dir(settings, component)}"
        )
    return found


def ensure_all(names: Sequence[str] | None = None, settings: BuildSettings | None = None) -> dict[str, Path]:
    settings = settings or BuildSettings()
    wanted = list(names) if names else list(COMPONENT_OF)
    return {name: ensure_binary(name, settings) for name in wanted}


def _component(name: str) -> str:
    try:
        return COMPONENT_OF[name]
    except KeyError:
        known = ", ".join(sorted(COMPONENT_OF))
        raise BinaryError(f"unknown program {name!r}; known programs: {known}") from None


@contextlib.contextmanager
def _component_lock(settings: BuildSettings, component: str) -> Iterator[None]:
    settings.cache_root.mkdir(parents=True, exist_ok=True)
    lock_path = settings.cache_root / f".{component}.lock"
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _obtain(settings: BuildSettings, component: str) -> None:
    started = time.monotonic()
    log(settings, f"{component} {component_version(settings, component)}: not cached, obtaining (minutes)")
    _build_go_component(settings, component)
    elapsed = time.monotonic() - started
    out = component_dir(settings, component)
    (out / "build-seconds").write_text(f"{elapsed:.0f}\n")
    log(settings, f"{component}: done in {elapsed:.0f} s -> {out / 'bin'}")


# ---------------------------------------------------------------------------------------------------------
# Go builds


@dataclass(frozen=True)
class GoBuild:
    """What to build for one Go component: a wrapper go.mod and the main packages."""

    module: str
    version: str
    packages: tuple[str, ...]
    replaces: tuple[tuple[str, str], ...] = ()
    ldflags: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


def _build_go_component(settings: BuildSettings, component: str) -> None:
    go = shutil.which(settings.go)
    if go is None:
        raise BinaryError(
            f"{component}: the Go toolchain ({settings.go!r}) is not on PATH; install Go >= 1.26 "
            "(https://go.dev/dl) so the control-plane programs can be built"
        )
    out = component_dir(settings, component)
    out.mkdir(parents=True, exist_ok=True)
    workdir = out / "wrapper"
    workdir.mkdir(exist_ok=True)
    env = _go_env()
    plan = _plan(settings, component, go, workdir, env)
    _write_wrapper(workdir, plan, settings)
    staging = Path(tempfile.mkdtemp(prefix="bin-", dir=out))
    try:
        cmd = [
            go,
            "build",
            "-p",
            str(settings.parallel),
            "-trimpath",
            *(["-tags", ",".join(plan.tags)] if plan.tags else []),
            "-ldflags",
            " ".join(["-s", "-w", *plan.ldflags]),
            "-o",
            str(staging) + "/",
            *plan.packages,
        ]
        log(settings, f"{component}: go build {' '.join(plan.packages)}")
        _run(component, "go build", cmd, cwd=workdir, env=env)
        _rename_outputs(staging, component)
        if component == "lws":
            _copy_lws_manifests(settings, go, workdir, env, plan.version)
        staging.chmod(0o755)
        final = out / "bin"
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _rename_outputs(staging: Path, component: str) -> None:
    # `go build -o dir/` names each binary after the last element of its package path.
    renames: dict[str, str] = {}
    if component == "etcd":
        renames = {"server": "etcd", "v3": "etcd"}
    elif component == "lws":
        renames = {"cmd": "lws-controller"}  # LWS's manager is the main package sigs.k8s.io/lws/cmd
    elif component == "prometheusadapter":
        renames = {"adapter": "prometheus-adapter"}  # main package sigs.k8s.io/prometheus-adapter/cmd/adapter
    for old, new in renames.items():
        if (staging / old).exists():
            (staging / old).rename(staging / new)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", "GOWORK": "off", "GOTOOLCHAIN": "local"})
    return env


def _run(component: str, step: str, cmd: Sequence[str], cwd: Path, env: Mapping[str, str]) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, env=dict(env), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-4000:]
        raise BinaryError(f"{component}: {step} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


def _module_info(
    component: str, go: str, module: str, version: str, cwd: Path, env: Mapping[str, str]
) -> dict[str, object]:
    out = _run(
        component, "go mod download", [go, "mod", "download", "-json", f"{module}@{version}"], cwd, env
    )
    info: dict[str, object] = json.loads(out)
    if "Error" in info:
        raise BinaryError(f"{component}: go mod download {module}@{version}: {info['Error']}")
    return info


def _plan(settings: BuildSettings, component: str, go: str, workdir: Path, env: Mapping[str, str]) -> GoBuild:
    version = component_version(settings, component)
    # `go mod download` needs a module context that does not pull in anything: an empty scratch module.
    scratch = workdir / "scratch"
    scratch.mkdir(exist_ok=True)
    (scratch / "go.mod").write_text("module disagg.local/scratch\n\ngo 1.26\n")
    if component == "kubernetes":
        info = _module_info(component, go, "k8s.io/kubernetes", version, scratch, env)
        gomod = Path(str(info["GoMod"])).read_text()
        commit = _origin_hash(info)
        return GoBuild(
            module="k8s.io/kubernetes",
            version=version,
            packages=tuple(f"k8s.io/kubernetes/cmd/{name}" for name in PROGRAMS_OF["kubernetes"]),
            replaces=staging_replaces(gomod, version),
            ldflags=kubernetes_version_ldflags(version, commit, _build_date(info)),
        )
    if component == "etcd":
        info = _module_info(component, go, "go.etcd.io/etcd/server/v3", version, scratch, env)
        return GoBuild(
            module="go.etcd.io/etcd/server/v3",
            version=version,
            # the etcd server module's root package is the `etcd` main (server/main.go)
            packages=("go.etcd.io/etcd/server/v3",),
            ldflags=(f"-X go.etcd.io/etcd/api/v3/version.GitSHA={_origin_hash(info)[:8]}",)
            if _origin_hash(info) != "unknown"
            else (),
        )
    if component == "kwok":
        return GoBuild(
            module="sigs.k8s.io/kwok",
            version=version,
            packages=("sigs.k8s.io/kwok/cmd/kwok",),
            ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={version}",),
        )
    if component == "helm":
        info = _module_info(component, go, "helm.sh/helm/v3", version, scratch, env)
        gomod = Path(str(info["GoMod"])).read_text()
        return GoBuild(
            module="helm.sh/helm/v3",
            version=version,
            packages=("helm.sh/helm/v3/cmd/helm",),
            ldflags=helm_version_ldflags(version, _origin_hash(info), gomod),
        )
    if component == "prometheus":
        info = _module_info(component, go, "github.com/prometheus/prometheus", version, scratch, env)
        return GoBuild(
            module="github.com/prometheus/prometheus",
            version=version,
            packages=tuple(
                f"github.com/prometheus/prometheus/cmd/{name}" for name in PROGRAMS_OF["prometheus"]
            ),
            # Prometheus' plugins/*.go build tags: drop every service discovery but Kubernetes (and the
            # built-in static/file ones) to keep the build short.
            tags=("remove_all_sd", "enable_kubernetes_sd"),
            ldflags=prometheus_version_ldflags(version, _origin_hash(info), _build_date(info)),
        )
    if component == "helmdocs":
        return GoBuild(
            module="github.com/norwoodj/helm-docs",
            version=version,
            packages=("github.com/norwoodj/helm-docs/cmd/helm-docs",),
            ldflags=(f"-X main.version={version.removeprefix('v')}",),
        )
    if component == "lws":
        info = _module_info(component, go, "sigs.k8s.io/lws", version, scratch, env)
        package = "sigs.k8s.io/lws/pkg/version"  # what LWS's Makefile sets (GitVersion, GitCommit, BuildDate)
        return GoBuild(
            module="sigs.k8s.io/lws",
            version=version,
            packages=("sigs.k8s.io/lws/cmd",),
            ldflags=(
                f"-X {package}.GitVersion={version}",
                f"-X {package}.GitCommit={_origin_hash(info)}",
                f"-X {package}.BuildDate={_build_date(info)}",
            ),
        )
    if component == "prometheusadapter":
        return GoBuild(
            module="sigs.k8s.io/prometheus-adapter",
            version=version,
            packages=("sigs.k8s.io/prometheus-adapter/cmd/adapter",),
        )
    if component == "registry":
        module = "github.com/distribution/distribution/v3"
        info = _module_info(component, go, module, version, scratch, env)
        return GoBuild(
            module=module,
            version=version,
            packages=(f"{module}/cmd/registry",),
            # what distribution's Makefile sets (GO_LDFLAGS: version.version, .revision, .mainpkg)
            ldflags=(
                f"-X {module}/version.version={version}",
                f"-X {module}/version.revision={_origin_hash(info)}",
                f"-X {module}/version.mainpkg={module}",
            ),
        )
    raise BinaryError(f"{component}: no Go build known")


# The LWS release's own manifests the local cluster installs, as the module ships them (config/ of
# sigs.k8s.io/lws): its CRDs, its webhook configurations (with the kustomize patches that scope the pod
# webhooks to LWS pods) and the ClusterRole its manager needs.
LWS_MANIFESTS: tuple[str, ...] = (
    "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
    "config/webhook/manifests.yaml",
    "config/webhook/mutating-patch.yaml",
    "config/webhook/validating-patch.yaml",
    "config/rbac/role.yaml",
)


def lws_manifest(relative: str, settings: BuildSettings | None = None) -> Path:
    """A manifest of the pinned LWS release, copied next to its program when it was built."""
    settings = settings or BuildSettings()
    return component_dir(settings, "lws") / "manifests" / relative


def _copy_lws_manifests(
    settings: BuildSettings, go: str, workdir: Path, env: Mapping[str, str], version: str
) -> None:
    info = _module_info("lws", go, "sigs.k8s.io/lws", version, workdir / "scratch", env)
    source = Path(str(info["Dir"]))
    target = component_dir(settings, "lws") / "manifests"
    for relative in LWS_MANIFESTS:
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / relative, path)


# The Prometheus Operator's CRDs the local cluster installs, as its module ships them.
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_CRDS: tuple[str, ...] = tuple(
    f"example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml"
    for plural in ("servicemonitors", "podmonitors", "prometheusrules")
)


def ensure_prometheus_operator_crds(settings: BuildSettings | None = None) -> list[Path]:
    """The pinned Prometheus Operator release's CRD manifests (PROMETHEUS_OPERATOR_CRDS), under
    ``~/.cache/disagg/prometheus-operator-<version>/`` (:func:`ensure_module_files`)."""
    settings = settings or BuildSettings()
    return ensure_module_files(
        "prometheus-operator",
        PROMETHEUS_OPERATOR_MODULE,
        settings.versions.prometheus_operator,
        PROMETHEUS_OPERATOR_CRDS,
        settings,
    )


def ensure_module_files(
    name: str, module: str, version: str, relatives: Sequence[str], settings: BuildSettings | None = None
) -> list[Path]:
    """Files ``relatives`` of Go module ``module@version`` (manifests a module ships, e.g. CRDs), copied
    from the Go module cache (``go mod download``) under ``~/.cache/disagg/<name>-<version>/`` once."""
    settings = settings or BuildSettings()
    out = settings.cache_root / f"{name}-{version}"
    paths = [out / "manifests" / relative for relative in relatives]
    if all(p.is_file() for p in paths):
        return paths
    with _component_lock(settings, name):
        if all(p.is_file() for p in paths):
            return paths
        go = shutil.which(settings.go)
        if go is None:
            raise BinaryError(f"{name}: the Go toolchain ({settings.go!r}) is not on PATH")
        log(settings, f"{name} {version}: not cached, go mod download (its manifests)")
        scratch = out / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "go.mod").write_text("module disagg.local/scratch\n\ngo 1.26\n")
        source = Path(str(_module_info(name, go, module, version, scratch, _go_env())["Dir"]))
        for relative, path in zip(relatives, paths, strict=True):
            if not (source / relative).is_file():
                raise BinaryError(f"{name} {version}: the module has no {relative}")
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.with_suffix(".tmp")
            shutil.copyfile(source / relative, staging)
            staging.chmod(0o644)  # the module cache is read-only
            staging.rename(path)
    return paths


def _origin_hash(info: Mapping[str, object]) -> str:
    origin = info.get("Origin")
    if isinstance(origin, dict) and isinstance(origin.get("Hash"), str):
        return str(origin["Hash"])
    return "unknown"


def _build_date(info: Mapping[str, object]) -> str:
    stamp = info.get("Time")
    return str(stamp) if isinstance(stamp, str) else "1970-01-01T00:00:00Z"


def _write_wrapper(workdir: Path, plan: GoBuild, settings: BuildSettings) -> None:
    lines = ["module disagg.local/build", "", "go 1.26.0", "", f"require {plan.module} {plan.version}", ""]
    if plan.replaces:
        lines.append("replace (")
        lines.extend(f"\t{old} => {new}" for old, new in plan.replaces)
        lines.append(")")
    gomod = workdir / "go.mod"
    text = "\n".join(lines) + "\n"
    if not gomod.exists() or gomod.read_text() != text:
        gomod.write_text(text)
        (workdir / "go.sum").unlink(missing_ok=True)


_REQUIRE_BLOCK = re.compile(r"^require\s*\((.*?)^\)", re.S | re.M)
_REQUIRE_LINE = re.compile(r"^require[ \t]+(\S+)[ \t]+(\S+)", re.M)
_REPLACE_BLOCK = re.compile(r"^replace\s*\((.*?)^\)", re.S | re.M)
_REPLACE_LINE = re.compile(r"^replace[ \t]+(.+)$", re.M)


def parse_requires(gomod: str) -> dict[str, str]:
    """Module -> version for every requirement in a go.mod text."""
    found: dict[str, str] = {}
    for block in _REQUIRE_BLOCK.findall(gomod):
        for line in block.splitlines():
            parts = line.split("//")[0].split()
            if len(parts) >= 2:
                found[parts[0]] = parts[1]
    for module, version in _REQUIRE_LINE.findall(gomod):
        if module != "(":
            found[module] = version
    return found


def parse_replaces(gomod: str) -> dict[str, str]:
    """Old module path -> replacement (``path`` or ``path version``) for every replace directive."""
    found: dict[str, str] = {}
    bodies = [line for block in _REPLACE_BLOCK.findall(gomod) for line in block.splitlines()]
    bodies += [line for line in _REPLACE_LINE.findall(gomod) if not line.strip().startswith("(")]
    for line in bodies:
        line = line.split("//")[0].strip()
        if "=>" not in line:
            continue
        old, new = (part.strip() for part in line.split("=>", 1))
        found[old.split()[0]] = new
    return found


def staging_replaces(gomod: str, kubernetes_version: str) -> tuple[tuple[str, str], ...]:
    """Replace directives for a wrapper of k8s.io/kubernetes, derived from its own go.mod.

    Each staging module it requires (``k8s.io/NAME => ./staging/src/k8s.io/NAME``) becomes
    ``k8s.io/NAME => k8s.io/NAME v0.<minor>.<patch>``, the published copy of the same release; other
    version replaces are kept; staging modules it does not require are left out (some are unpublished).
    """
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kubernetes_version)
    if match is None:
        raise BinaryError(f"kubernetes: version {kubernetes_version!r} is not of the form v1.MINOR.PATCH")
    staging_version = f"v0.{match.group(1)}.{match.group(2)}"
    requires = parse_requires(gomod)
    result: list[tuple[str, str]] = []
    for old, new in sorted(parse_replaces(gomod).items()):
        if new.startswith("./staging/"):
            if old in requires:
                result.append((old, f"{old} {staging_version}"))
        elif new.startswith((".", "/")):
            raise BinaryError(
                f"kubernetes: go.mod replaces {old} with local path {new}; cannot build from the proxy"
            )
        else:
            result.append((old, new))
    if not result:
        raise BinaryError("kubernetes: no staging replace directives found in k8s.io/kubernetes's go.mod")
    return tuple(result)


def kubernetes_version_ldflags(version: str, commit: str, build_date: str) -> tuple[str, ...]:
    """The -X flags Kubernetes' hack/lib/version.sh (kube::version::ldflags) sets, for component-base and
    client-go; kubectl and helm read gitVersion/gitMajor/gitMinor from /version."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+.*", version)
    if match is None:
        raise BinaryError(f"kubernetes: version {version!r} is not a semantic version")
    values = {
        "gitVersion": version,
        "gitMajor": match.group(1),
        "gitMinor": match.group(2),
        "gitCommit": commit,
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    flags: list[str] = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags.extend(f"-X {package}.{key}={value}" for key, value in values.items())
    return tuple(flags)


def helm_version_ldflags(version: str, commit: str, helm_gomod: str) -> tuple[str, ...]:
    """The -X flags helm's Makefile sets: its own version and the Kubernetes version it templates for.

    Source: helm v3.22.0 Makefile (LDFLAGS += -X helm.sh/helm/v3/internal/version.version=... and
    pkg/lint/rules, pkg/chartutil k8sVersionMajor/Minor from the k8s.io/client-go it requires).
    """
    client_go = parse_requires(helm_gomod).get("k8s.io/client-go", "")
    match = re.fullmatch(r"v0\.(\d+)\.\d+.*", client_go)
    if match is None:
        raise BinaryError(f"helm: cannot read the Kubernetes version from its k8s.io/client-go {client_go!r}")
    k8s_minor = match.group(1)
    flags = [
        f"-X helm.sh/helm/v3/internal/version.version={version}",
        f"-X helm.sh/helm/v3/internal/version.gitCommit={commit}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    ]
    for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags.append(f"-X {package}.k8sVersionMajor=1")
        flags.append(f"-X {package}.k8sVersionMinor={k8s_minor}")
    return tuple(flags)


def prometheus_release(module_version: str) -> str:
    """Prometheus' Go module version v0.MMM.P (since 3.0) names release MMM//100 . MMM%100 . P."""
    match = re.fullmatch(r"v0\.(\d)(\d\d)\.(\d+)", module_version)
    if match is None:
        raise BinaryError(f"prometheus: module version {module_version!r} is not of the form v0.MMM.P")
    return f"{match.group(1)}.{int(match.group(2))}.{match.group(3)}"


def prometheus_version_ldflags(module_version: str, commit: str, build_date: str) -> tuple[str, ...]:
    """The -X flags of Prometheus' .promu.yml (github.com/prometheus/common/version)."""
    package = "github.com/prometheus/common/version"
    values = {
        "Version": prometheus_release(module_version),
        "Revision": commit,
        "Branch": "HEAD",
        "BuildUser": "disagg",
        "BuildDate": build_date,
    }
    return tuple(f"-X {package}.{key}={value}" for key, value in values.items())


# ---------------------------------------------------------------------------------------------------------


def cache_size_bytes(settings: BuildSettings | None = None) -> int:
    settings = settings or BuildSettings()
    root = settings.cache_root
    if not root.exists():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: Sequence[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv)
    try:
        paths = ensure_all(names or None)
    except BinaryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
