"""`kubectl disagg status` on the local control plane: the real kubectl finds the kubectl-disagg console
script on PATH, and the plugin prints a DisaggregatedDeployment's P:D, the SLO of its RatioPolicy and the
decisions with their causes from the status (written here as the operator would; no operator runs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from disagg.cluster.layout import ClusterInfo
from disagg.k8s.client import DISAGG_DEPLOYMENT, RATIO_POLICY, KubeApi

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = Path(sys.executable).parent / "kubectl-disagg"

DD: dict[str, Any] = {
    "apiVersion": "disagg.dev/v1alpha1",
    "kind": "DisaggregatedDeployment",
    "metadata": {"name": "plugin-case"},
    "spec": {
        "model": {
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "source": {"huggingFace": {"id": "meta-llama/Llama-3.1-8B-Instruct"}},
        },
        "engine": {"type": "vllm"},
        "kvTransfer": {"connector": "nixl"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 2},
        "autoscaling": {"enabled": True, "policyRef": {"name": "chat"}, "mode": "advisory"},
    },
}
STATUS: dict[str, Any] = {
    "prefill": {"replicas": 1, "ready": 1, "desired": 1, "display": "1/1"},
    "decode": {"replicas": 3, "ready": 2, "desired": 3, "display": "2/3"},
    "ratio": "1:3",
    "router": {"endpoint": "http://plugin-case-router.ns.svc:8000", "replicas": 1, "ready": 1},
    "autoscaling": {
        "policy": "chat",
        "mode": "advisory",
        "desiredReplicas": {"prefill": 1, "decode": 3},
        "lastEvaluation": {"time": "2026-01-01T00:02:00Z", "prefill": 1, "decode": 3, "cause": "NoChange"},
        "decisions": [
            {
                "time": "2026-01-01T00:01:00Z",
                "prefill": 1,
                "decode": 3,
                "cause": "ITLBreachDecodeKV",
                "message": "ITL p90 0.061 s > 0.04 s, KV usage 0.91",
            },
            {"time": "2026-01-01T00:00:00Z", "prefill": 1, "decode": 2, "cause": "Initial"},
        ],
    },
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "ReplicasNotReady",
            "message": "decode 2/3 ready",
            "lastTransitionTime": "2026-01-01T00:01:00Z",
        }
    ],
}


def _kubectl_disagg(cluster: ClusterInfo, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.env()
    env["PATH"] = f"{PLUGIN.parent}:{env['PATH']}"  # where kubectl looks for kubectl-disagg
    kubectl = shutil.which("kubectl", path=env["PATH"])
    assert kubectl is not None, "the cluster's kubectl is not cached"
    return subprocess.run(
        [kubectl, "disagg", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_kubectl_disagg_status_prints_pd_slo_and_decisions(
    crds: list[str], kube: KubeApi, cluster: ClusterInfo, namespace: str
) -> None:
    assert PLUGIN.is_file(), "kubectl-disagg is not installed: pip install -e ."
    policy = yaml.safe_load((ROOT / "policies" / "chat.yaml").read_text())
    kube.create(RATIO_POLICY, namespace, policy)
    kube.create(DISAGG_DEPLOYMENT, namespace, DD)
    kube.merge_patch_status(DISAGG_DEPLOYMENT, namespace, "plugin-case", STATUS)

    result = _kubectl_disagg(cluster, "status", "plugin-case", "-n", namespace)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"DisaggregatedDeployment {namespace}/plugin-case\n")
    assert "P:D:        1:3 desired, 1:2 ready" in out
    assert "Autoscaling: advisory, RatioPolicy chat" in out
    assert "SLO:        TTFT p90 <= 1s, ITL p90 <= 40ms  (RatioPolicy chat)" in out
    lines = out.splitlines()
    decisions = lines.index("Decisions (newest first, 2 of 2):")
    assert "1:3" in lines[decisions + 1] and "ITLBreachDecodeKV" in lines[decisions + 1]
    assert "ITL p90 0.061 s > 0.04 s" in lines[decisions + 1]
    assert "Initial" in lines[decisions + 2]
    assert any("NoChange" in line for line in lines[:decisions])  # the last evaluation
    assert any(line.split()[:3] == ["Ready", "False", "ReplicasNotReady"] for line in lines)

    missing = _kubectl_disagg(cluster, "status", "no-such-deployment", "-n", namespace)
    assert missing.returncode == 1 and missing.stdout == ""
    assert f"{namespace}/no-such-deployment not found" in missing.stderr
    usage = _kubectl_disagg(cluster, "status")
    assert usage.returncode == 2 and "NAME" in usage.stderr
