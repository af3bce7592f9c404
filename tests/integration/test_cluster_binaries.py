"""How the wrapper modules are derived from the upstream go.mod files, and what the cached programs report."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from disagg.cluster import monitoring
from disagg.cluster.binaries import (
    BinaryError,
    Versions,
    ensure_binary,
    helm_version_ldflags,
    kubernetes_version_ldflags,
    parse_requires,
    staging_replaces,
)
from disagg.cluster.local import ClusterInfo

KUBERNETES_GOMOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tgithub.com/spf13/cobra v1.10.2
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0 // indirect
)

require k8s.io/kubectl v0.0.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kubectl => ./staging/src/k8s.io/kubectl
\tk8s.io/sample-controller => ./staging/src/k8s.io/sample-controller
)

replace github.com/example/fork => github.com/example/fork v1.2.3
"""


def test_staging_modules_become_their_published_release() -> None:
    replaces = dict(staging_replaces(KUBERNETES_GOMOD, "v1.37.2"))
    assert replaces == {
        "k8s.io/api": "k8s.io/api v0.37.2",
        "k8s.io/client-go": "k8s.io/client-go v0.37.2",
        "k8s.io/kubectl": "k8s.io/kubectl v0.37.2",
        # not required, so left out (unpublished staging modules would break the build)
        "github.com/example/fork": "github.com/example/fork v1.2.3",
    }


def test_local_replace_outside_staging_is_refused() -> None:
    gomod = KUBERNETES_GOMOD + "replace k8s.io/other => ../other\n"
    with pytest.raises(BinaryError, match=r"k8s\.io/other"):
        staging_replaces(gomod, "v1.37.2")


def test_requires_are_parsed_from_blocks_and_single_lines() -> None:
    requires = parse_requires(KUBERNETES_GOMOD)
    assert requires["k8s.io/client-go"] == "v0.0.0"
    assert requires["k8s.io/kubectl"] == "v0.0.0"
    assert requires["github.com/spf13/cobra"] == "v1.10.2"


def test_version_ldflags_name_the_release() -> None:
    flags = kubernetes_version_ldflags("v1.37.2", "abc123", "2026-10-27T12:01:04Z")
    assert "-X k8s.io/component-base/version.gitVersion=v1.37.2" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=37" in flags
    helm = helm_version_ldflags("v3.22.0", "def", "require k8s.io/client-go v0.37.0\n")
    assert "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37" in helm
    assert "-X helm.sh/helm/v3/internal/version.version=v3.22.0" in helm


def test_unknown_program_is_named_in_the_error() -> None:
    with pytest.raises(BinaryError, match="kube-proxy"):
        ensure_binary("kube-proxy")


def test_cached_programs_report_their_pinned_versions() -> None:
    versions = Versions()
    etcd = subprocess.run(
        [str(ensure_binary("etcd")), "--version"], capture_output=True, text=True, check=True
    )
    assert f"etcd Version: {versions.etcd.lstrip('v')}" in etcd.stdout
    apiserver = subprocess.run(
        [str(ensure_binary("kube-apiserver")), "--version"], capture_output=True, text=True, check=True
    )
    assert apiserver.stdout.strip() == f"Kubernetes {versions.kubernetes}"


def test_prometheus_operator_crds_are_the_pinned_releases_and_the_cluster_serves_them(
    cluster: ClusterInfo, k8s_api: Any
) -> None:
    """The CRDs come from the pinned module as it ships them (its release stamps its version on each), and
    the local control plane serves them Established."""
    from kubernetes import client

    release = Versions().prometheus_operator.removeprefix("v")
    for crd in monitoring.crds():
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == release
        served = client.ApiextensionsV1Api(k8s_api).read_custom_resource_definition(crd["metadata"]["name"])
        assert any(c.type == "Established" and c.status == "True" for c in served.status.conditions)
    kinds = {crd["spec"]["names"]["kind"] for crd in monitoring.crds()}
    assert kinds == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
