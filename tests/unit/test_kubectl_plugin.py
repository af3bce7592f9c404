"""`kubectl disagg` (the kubectl-disagg console script): what `status` prints from an object and its
policy, and the conventions every disagg command keeps (--help with the exit codes, 1 failure, 2 usage).
The live read is tested on the local control plane (tests/integration/test_kubectl_plugin.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from disagg.api.common import parse_rfc3339
from disagg.clicommon import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from disagg.kubectl import format_status, main

NOW = parse_rfc3339("2026-01-01T00:05:00Z") or 0.0
DD: dict[str, Any] = {
    "kind": "DisaggregatedDeployment",
    "metadata": {"name": "llama", "namespace": "serving"},
    "spec": {"autoscaling": {"enabled": True, "policyRef": {"name": "chat"}}},
    "status": {
        "prefill": {"replicas": 2, "ready": 2, "desired": 2},
        "decode": {"replicas": 3, "ready": 1, "desired": 4},
        "autoscaling": {
            "mode": "active",
            "decisions": [
                {"time": f"2026-01-01T00:0{4 - i}:00Z", "prefill": 2, "decode": 4 - i, "cause": f"Cause{i}"}
                for i in range(3)
            ],
        },
    },
}
POLICY = {"spec": {"slo": {"ttft": {"percentile": 95, "targetSeconds": 0.5}}}}


def test_status_shows_pd_slo_and_the_newest_decisions() -> None:
    out = format_status(DD, POLICY, NOW, decisions=2)
    assert out.splitlines()[0] == "DisaggregatedDeployment serving/llama"
    assert "P:D:        2:4 desired, 2:1 ready (prefill 2/2, decode 1/4 ready/desired)" in out
    assert "Autoscaling: active, RatioPolicy chat" in out
    # the SLO as the API server defaults it: ITL p90 50 ms unless the policy says otherwise
    assert "SLO:        TTFT p95 <= 0.5s, ITL p90 <= 50ms  (RatioPolicy chat)" in out
    assert "Decisions (newest first, 2 of 3):" in out
    assert "2026-01-01T00:04:00Z (1m ago)  2:4     Cause0" in out and "Cause1" in out
    assert "Cause2" not in out


def test_status_without_autoscaling_status_or_policy() -> None:
    bare = {"metadata": {"name": "x", "namespace": "ns"}, "spec": {}}
    out = format_status(bare, None, NOW)
    assert "no status yet" in out and "Autoscaling: off" in out and "SLO" not in out
    assert "SLO:        RatioPolicy chat not found" in format_status(DD, None, NOW)
    assert "Scale:" not in out


def test_status_says_when_an_external_autoscaler_sets_the_total() -> None:
    scaled = {"metadata": {"name": "x", "namespace": "ns"}, "spec": {"replicas": 6}}
    out = format_status(scaled, None, NOW)
    assert "Autoscaling: off (the ratio from spec.prefill.replicas and spec.decode.replicas)" in out
    assert "Scale:      6 replicas in all (spec.replicas, /scale: HPA, KEDA or kubectl scale)" in out


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["status", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == EXIT_OK
        out = capsys.readouterr().out
        assert "usage: kubectl disagg" in out and "0  success" in out and "2  usage" in out


@pytest.mark.parametrize("argv", [[], ["nonsense"], ["status"], ["status", "x", "--decisions", "0"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == EXIT_USAGE
    assert "kubectl disagg" in capsys.readouterr().err


def test_an_unreadable_kubeconfig_is_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    assert main(["status", "x", "-n", "ns", "--kubeconfig", str(config)]) == EXIT_FAILURE
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("kubectl disagg status: ")


def test_an_unreachable_api_server_is_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: team}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    argv = ["status", "x", "--kubeconfig", str(config), "--request-timeout", "5"]
    assert main(argv) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "unreachable" in err and "/namespaces/team/" in err  # the context's namespace, as kubectl
