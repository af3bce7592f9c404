"""The EndpointPickerConfig spec.router.type gateway-api renders, loaded by the released config loader.

tests/conformance/eppcheck/main.go calls the Gateway API Inference Extension's loader
(pkg/epp/config/loader LoadRawConfig) at v1.4.0, the version llm-d-inference-scheduler v0.7.1's go.mod
requires and whose runner its EPP runs (cmd/epp/runner/runner.go parseConfigurationPhaseOne registers the
same three feature gates first): strict decoding into EndpointPickerConfig v1alpha1, static defaults,
feature-gate validation. Built once from the Go module proxy into ``<cache>/eppcheck-<hash>/``.

Not checked here: the plugins' own parameters, which only the llm-d scheduler's plugin factories read;
its module cannot be built here (its dependency github.com/llm-d/llm-d-kv-cache v0.7.1 is not served by
the Go module proxy), so those keys were read from its source (disagg.render.gateway's comments).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.cluster.binaries import default_cache_root
from disagg.render import gateway

pytestmark = [pytest.mark.conformance, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).parent / "eppcheck"


@pytest.fixture(scope="module")
def eppcheck() -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("the Go toolchain is not on PATH")
    files = sorted(SOURCE.iterdir())
    digest = hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files)).hexdigest()[:12]
    out = default_cache_root() / f"eppcheck-{digest}"
    binary = out / "eppcheck"
    if binary.is_file():
        return binary
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, src / f.name)
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOWORK": "off",
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=readonly",
    }
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=src, env=env, check=True, timeout=1800)
    return binary


def load(eppcheck: Path, text: str, tmp_path: Path) -> tuple[int, str]:
    path = tmp_path / "epp-config.yaml"
    path.write_text(text)
    result = subprocess.run(
        [str(eppcheck), str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("example", ["vllm-nixl.yaml", "sglang-nixl.yaml"])
def test_the_rendered_pd_config_loads(eppcheck: Path, tmp_path: Path, example: str) -> None:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["spec"]["router"] = {"type": "gateway-api"}
    dd = DisaggregatedDeployment.model_validate(doc)
    code, output = load(eppcheck, gateway.epp_config_text(dd), tmp_path)
    assert code == 0, output
    loaded: dict[str, Any] = json.loads(output)
    assert loaded["gates"]["prepareDataPlugins"] is True
    config = loaded["config"]
    names = {plugin["name"] for plugin in config["plugins"]}  # defaulted to the type by the loader
    assert {"disagg-profile-handler", "prefill-filter", "decode-filter"} <= names
    for profile in config["schedulingProfiles"]:
        assert {ref["pluginRef"] for ref in profile["plugins"]} <= names, profile["name"]


def test_the_loader_refuses_unknown_keys_and_gates(eppcheck: Path, tmp_path: Path) -> None:
    dd = DisaggregatedDeployment.model_validate(
        yaml.safe_load((ROOT / "examples" / "vllm-nixl-gateway.yaml").read_text())
    )
    config = gateway.epp_config(dd)
    config["schedulingProfile"] = config.pop("schedulingProfiles")
    code, output = load(eppcheck, yaml.safe_dump(config), tmp_path)
    assert code == 1 and 'unknown field "schedulingProfile"' in output
    config = gateway.epp_config(dd)
    config["featureGates"] = ["prepareData"]
    code, output = load(eppcheck, yaml.safe_dump(config), tmp_path)
    assert code == 1 and "feature gate 'prepareData' is unknown" in output
