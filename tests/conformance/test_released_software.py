"""Every rendered flag, --kv-transfer-config key, env var, probe path and annotation against the RELEASED
engines and routers at the pinned versions (disagg.cluster.released.pinned_releases).

Run again on every version bump: a flag renamed upstream fails here, not in a user's pod. The cases are
every example in examples/ and a generated spec for every engine x connector combination the API
accepts (found by validating each one with the pydantic model, so the test follows the support matrix
as it changes); negative tests prove that the checker bites.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from disagg.api.common import describe_validation_error
from disagg.api.deployment import DisaggregatedDeployment
from disagg.cli import main
from disagg.conformance.check import Finding, ParseRouter, ReleasedFacts, check_children
from disagg.conformance.facts import cache_dir
from disagg.conformance.routers import launcher_module
from disagg.render import render_children

pytestmark = pytest.mark.conformance

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = tuple(sorted((ROOT / "examples").glob("*.yaml")))
Obj = dict[str, Any]


# ------------------------------------------------------------------------------ what the API accepts


def _field(model: type[BaseModel], alias: str) -> Any:
    for name, info in model.model_fields.items():
        if alias in (name, info.alias):
            return info.annotation
    raise AssertionError(f"{model.__name__} has no field {alias}")


def _literal_values(annotation: Any) -> tuple[str, ...]:
    """The values of ``Literal[...]`` (or ``Literal[...] | None``)."""
    values: list[str] = []
    for arg in get_args(annotation) or ():
        if isinstance(arg, str):
            values.append(arg)
        else:
            values += _literal_values(arg)
    return tuple(values)


SPEC_MODEL = _field(DisaggregatedDeployment, "spec")
ENGINES = _literal_values(_field(_field(SPEC_MODEL, "engine"), "type"))
CONNECTORS = _literal_values(_field(_field(SPEC_MODEL, "kvTransfer"), "connector"))
DTYPES = _literal_values(_field(_field(SPEC_MODEL, "model"), "dtype"))
COMBINATIONS = tuple((engine, connector) for engine in ENGINES for connector in CONNECTORS)


def generated_spec(engine: str, connector: str, full: bool = False) -> Obj:
    """A DisaggregatedDeployment for one combination; ``full`` sets every optional model field the
    renderer maps to an engine option."""
    source: Obj = {"id": "meta-llama/Llama-3.1-8B-Instruct"}
    model: Obj = {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-3.1-8b", "source": {}}
    if full:
        source |= {"revision": "main", "tokenSecretRef": {"name": "hf-token", "key": "token"}}
        model |= {"maxModelLen": 8192, "dtype": "bfloat16", "quantization": "fp8"}
    model["source"] = {"huggingFace": source}
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": f"conf-{engine}-{connector}", "namespace": "conformance"},
        "spec": {
            "model": model,
            "engine": {"type": engine},
            "kvTransfer": {"connector": connector},
            "prefill": {"replicas": 1, "tensorParallelSize": 1},
            "decode": {"replicas": 1, "tensorParallelSize": 2},
        },
    }


def accepted(doc: Obj) -> DisaggregatedDeployment:
    """The validated deployment; the test is skipped when the API refuses the combination itself."""
    try:
        return DisaggregatedDeployment.model_validate(doc)
    except ValidationError as exc:
        reasons = [problem for problem in describe_validation_error(exc) if "connector" in problem]
        if reasons:
            spec = doc["spec"]
            combination = f"{spec['engine']['type']} x {spec['kvTransfer']['connector']}"
            pytest.skip(f"the API refuses {combination}: {reasons[0]}")
        raise


def _report(findings: list[Finding]) -> str:
    return "mismatches with the released software:\n  " + "\n  ".join(map(str, findings))


def _findings(dd: DisaggregatedDeployment, facts: ReleasedFacts, parse_router: ParseRouter) -> list[Finding]:
    return check_children(render_children(dd), facts, parse_router)


# ---------------------------------------------------------------------------------------- positives


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_conforms(example: Path, released_facts: ReleasedFacts, parse_router: ParseRouter) -> None:
    dd = DisaggregatedDeployment.model_validate(yaml.safe_load(example.read_text()))
    findings = _findings(dd, released_facts, parse_router)
    assert not findings, _report(findings)


@pytest.mark.parametrize("full", [False, True], ids=["minimal", "full"])
@pytest.mark.parametrize(("engine", "connector"), COMBINATIONS, ids=[f"{e}-{c}" for e, c in COMBINATIONS])
def test_accepted_combination_conforms(
    engine: str, connector: str, full: bool, released_facts: ReleasedFacts, parse_router: ParseRouter
) -> None:
    dd = accepted(generated_spec(engine, connector, full))
    findings = _findings(dd, released_facts, parse_router)
    assert not findings, _report(findings)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("engine", ENGINES)
def test_every_dtype_the_api_accepts_is_one_the_engine_accepts(
    engine: str, dtype: str, released_facts: ReleasedFacts, parse_router: ParseRouter
) -> None:
    doc = _first_accepted(engine)
    doc["spec"]["model"]["dtype"] = dtype
    findings = _findings(DisaggregatedDeployment.model_validate(doc), released_facts, parse_router)
    assert not findings, _report(findings)


def _try(doc: Obj) -> DisaggregatedDeployment | None:
    try:
        return DisaggregatedDeployment.model_validate(doc)
    except ValidationError:
        return None


# --------------------------------------------------------------------- the facts are really there


def test_vllm_facts_come_from_the_wheel(released_facts: ReleasedFacts) -> None:
    vllm = released_facts.engines["vllm"]
    assert vllm.version == "0.33.0"
    # explicit strings (arg_utils.py), generated frontend fields (cli_args.py), BooleanOptionalAction
    assert {
        "--kv-transfer-config",
        "-tp",
        "--host",
        "--uvicorn-log-level",
        "--no-enable-prefix-caching",
    } <= set(vllm.options)
    assert vllm.options["--enable-prefix-caching"].arity == "flag"
    assert vllm.options["--served-model-name"].arity == "list"
    assert vllm.options["--dtype"].choices is not None and "bfloat16" in vllm.options["--dtype"].choices
    assert vllm.options["--kv-transfer-config"].source.startswith("vllm/engine/arg_utils.py:")
    assert {
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "VLLM_MOONCAKE_BOOTSTRAP_PORT",
    } <= set(vllm.env)
    assert vllm.kv_transfer_fields["kv_role"].choices == ("kv_producer", "kv_both", "kv_consumer")
    assert {"NixlConnector", "MooncakeConnector", "LMCacheConnectorV1"} <= set(vllm.kv_connectors)
    assert {"/health", "/metrics", "/v1/completions"} <= set(vllm.routes)
    assert [route.generates for route in vllm.health] == [False]
    assert (cache_dir() / "vllm-0.33.0.json").is_file()


def test_sglang_facts_come_from_the_wheel(released_facts: ReleasedFacts) -> None:
    sglang = released_facts.engines["sglang"]
    assert sglang.version == "0.5.23"
    assert {"--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--enable-metrics"} <= set(
        sglang.options
    )
    backend = sglang.options["--disaggregation-transfer-backend"]
    assert backend.choices is not None and {"mooncake", "nixl"} <= set(backend.choices)
    assert sglang.options["--disaggregation-mode"].choices == ("null", "prefill", "decode")
    assert {"/health", "/health_generate", "/ready", "/metrics"} <= set(sglang.routes)
    health = {route.path: route for route in sglang.health}
    assert health["/health"].generates and health["/health"].min_seconds >= 1
    assert health["/health"].disabled_by_env == "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def test_router_facts_come_from_the_wheels(released_facts: ReleasedFacts) -> None:
    vllm_router = released_facts.routers["vllm-router"]
    sglang_router = released_facts.routers["sglang-router"]
    assert vllm_router.bootstrap_port_annotation == "vllm.ai/bootstrap-port"
    assert sglang_router.bootstrap_port_annotation == "sglang.ai/bootstrap-port"
    assert vllm_router.annotation_source.startswith("vllm_router/router_args.py:")


# ----------------------------------------------------------------------------- the checker bites


def _children(spec: Obj) -> list[Obj]:
    return render_children(DisaggregatedDeployment.model_validate(spec))


def _first_accepted(engine: str) -> Obj:
    for connector in CONNECTORS:
        doc = generated_spec(engine, connector)
        if _try(doc) is not None:
            return doc
    pytest.skip(f"the API accepts no connector for {engine}")


def _container(children: list[Obj], suffix: str) -> tuple[Obj, Obj]:
    """(pod template, first container) of the Deployment whose name ends with ``suffix``."""
    for obj in children:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"].endswith(suffix):
            template = obj["spec"]["template"]
            return template, template["spec"]["containers"][0]
    raise AssertionError(f"no Deployment *{suffix}")


def _kinds(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.kind, f.item) for f in findings}


def _new_findings(
    children: list[Obj],
    mutate: Callable[[list[Obj]], None],
    facts: ReleasedFacts,
    parse_router: ParseRouter | None = None,
) -> list[Finding]:
    """What ``mutate`` adds to the findings of ``children`` (so a real mismatch elsewhere, reported by
    the positive tests, does not mask or fake what a negative test looks for)."""
    before = set(check_children(children, facts, parse_router))
    mutated = copy.deepcopy(children)
    mutate(mutated)
    return [f for f in check_children(mutated, facts, parse_router) if f not in before]


def test_made_up_flag_is_found(released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        _, engine = _container(children, "-decode")
        engine["args"] = [
            "--kv-transfer-configs" if a == "--kv-transfer-config" else a for a in engine["args"]
        ]

    children = _children(_first_accepted("vllm"))
    new = _new_findings(children, mutate, released_facts)
    flag = [f for f in new if f.kind == "flag" and f.item == "--kv-transfer-configs"]
    assert flag and "did you mean --kv-transfer-config?" in flag[0].why
    assert flag[0].obj.endswith("-decode") and flag[0].container == _container(children, "-decode")[1]["name"]


def test_flag_forms_are_split_and_checked(released_facts: ReleasedFacts) -> None:
    def extend(*extra: str) -> Callable[[list[Obj]], None]:
        def mutate(children: list[Obj]) -> None:
            _, engine = _container(children, "-prefill")
            engine["args"] = [*engine["args"], *extra]

        return mutate

    children = _children(_first_accepted("vllm"))
    valid = extend(
        *("--max-model-len=4096", "--max_num_seqs", "64", "-tp", "2", "--no-enable-prefix-caching", "-O3"),
        *("--kv-transfer-config.kv_load_failure_policy", "fail", "--compilation-config", '{"level": 3}'),
    )
    assert _new_findings(children, valid, released_facts) == []
    invalid = extend(
        *("--kv-transfer-config.kv_rank", "0", "--enable-prefix-caching=yes", "--dtype", "bfloat17", "--port")
    )
    found = _kinds(_new_findings(children, invalid, released_facts))
    assert ("kv-transfer-config", "kv_rank") in found  # a KVTransferConfig key given on its own
    assert ("value", "--enable-prefix-caching") in found  # a flag given a value
    assert ("value", "--dtype bfloat17") in found  # not one of the choices
    assert ("value", "--port") in found  # a value-taking option at the end, without its value


def test_kv_transfer_config_keys_and_connector_are_checked(released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        _, engine = _container(children, "-prefill")
        index = engine["args"].index("--kv-transfer-config") + 1
        config = json.loads(engine["args"][index])
        config["kv_rol"] = config.pop("kv_role")
        config["kv_connector"] = "P2pNcclConnector"
        engine["args"][index] = json.dumps(config)

    found = _kinds(_new_findings(_children(_first_accepted("vllm")), mutate, released_facts))
    assert ("kv-transfer-config", "kv_rol") in found
    assert ("kv-transfer-config", "kv_connector=P2pNcclConnector") in found


def test_kv_connector_extra_config_keys_are_checked(released_facts: ReleasedFacts) -> None:
    assert "backends" in released_facts.engines["vllm"].kv_extra_config_keys["NixlConnector"]

    def mutate(children: list[Obj]) -> None:
        _, engine = _container(children, "-decode")
        index = engine["args"].index("--kv-transfer-config") + 1
        config = json.loads(engine["args"][index])
        config["kv_connector"] = "NixlConnector"
        config["kv_connector_extra_config"] = {"backends": ["UCX"], "backend": ["UCX"]}
        engine["args"][index] = json.dumps(config)

    new = _new_findings(_children(_first_accepted("vllm")), mutate, released_facts)
    assert [(f.kind, f.item) for f in new] == [("kv-transfer-config", "kv_connector_extra_config.backend")]
    assert "did you mean backends?" in new[0].why


def test_misspelled_env_var_is_found(released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        _, engine = _container(children, "-decode")
        engine["env"] = [
            *engine.get("env", []),
            {"name": "VLLM_NIXL_SIDE_CHANNEL_HOTS", "value": "x"},
            {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"},  # UCX's, on the allow-list
        ]

    new = _new_findings(_children(_first_accepted("vllm")), mutate, released_facts)
    assert [(f.kind, f.item) for f in new] == [("env", "VLLM_NIXL_SIDE_CHANNEL_HOTS")]
    assert "did you mean VLLM_NIXL_SIDE_CHANNEL_HOST?" in new[0].why


def test_undefined_expansion_is_found(released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        _, engine = _container(children, "-decode")
        engine["args"] = [*engine["args"], "--host", "$(POD_IPV4)"]

    new = _new_findings(_children(_first_accepted("vllm")), mutate, released_facts)
    assert ("expansion", "$(POD_IPV4)") in _kinds(new)


def test_wrong_bootstrap_annotation_name_is_found(released_facts: ReleasedFacts) -> None:
    def rename(children: list[Obj]) -> None:
        annotations = _container(children, "-prefill")[0]["metadata"]["annotations"]
        annotations["vllm.ai/bootstrap-port"] = annotations.pop("sglang.ai/bootstrap-port")

    def wrong_port(children: list[Obj]) -> None:
        _container(children, "-prefill")[0]["metadata"]["annotations"]["sglang.ai/bootstrap-port"] = "9999"

    children = _children(_first_accepted("sglang"))
    found = _kinds(_new_findings(children, rename, released_facts))
    assert ("annotation", "vllm.ai/bootstrap-port") in found  # sglang-router does not read it
    assert ("annotation", "sglang.ai/bootstrap-port") in found  # and the one it reads is missing
    found = _kinds(_new_findings(children, wrong_port, released_facts))
    assert found == {("annotation", "sglang.ai/bootstrap-port=9999")}


def test_bogus_probe_path_is_found(released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        _container(children, "-decode")[1]["readinessProbe"]["httpGet"]["path"] = "/healthz"
        _container(children, "-router")[1]["livenessProbe"]["httpGet"]["path"] = "/readyz"

    for engine_type in ENGINES:
        found = _kinds(_new_findings(_children(_first_accepted(engine_type)), mutate, released_facts))
        assert ("probe", "readinessProbe /healthz") in found, engine_type
        assert ("probe", "livenessProbe /readyz") in found, engine_type


def test_sglang_health_probe_needs_time_to_generate(released_facts: ReleasedFacts) -> None:
    def default_timeout(children: list[Obj]) -> None:
        probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
        _container(children, "-decode")[1]["livenessProbe"] = probe

    def switched_off(children: list[Obj]) -> None:
        default_timeout(children)
        engine = _container(children, "-decode")[1]
        engine["env"] = [
            *engine.get("env", []),
            {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "false"},
        ]

    children = _children(_first_accepted("sglang"))
    new = _new_findings(children, default_timeout, released_facts)
    assert [f.item for f in new] == ["livenessProbe /health timeoutSeconds=1"]
    assert _new_findings(children, switched_off, released_facts) == []


def test_router_rejects_unknown_flag(released_facts: ReleasedFacts, parse_router: ParseRouter) -> None:
    def mutate(children: list[Obj]) -> None:
        router = _container(children, "-router")[1]
        router["command"] = [*router["command"], "--prefill-selectorr", "a=b"]

    for engine_type in ENGINES:
        children = _children(_first_accepted(engine_type))
        router = _container(children, "-router")[1]
        package = "vllm-router" if engine_type == "vllm" else "sglang-router"
        _, argv = launcher_module(package, router["command"])
        # The real parser takes what we render ...
        assert parse_router(package, [a.replace("$(POD_NAMESPACE)", "conformance") for a in argv]).ok
        # ... and refuses a flag it does not declare.
        rejected = parse_router(package, [*argv, "--service-discovery-namespaces", "x"])
        assert not rejected.ok and "unrecognized arguments: --service-discovery-namespaces" in rejected.error
        new = _new_findings(children, mutate, released_facts, parse_router)
        assert [f.kind for f in new] == ["router"], engine_type
        assert "unrecognized arguments: --prefill-selectorr" in new[0].why


def test_router_invalid_choice_is_rejected(parse_router: ParseRouter) -> None:
    argv = ["--vllm-pd-disaggregation", "--service-discovery", "--kv-connector", "lmcache"]
    result = parse_router("vllm-router", argv)
    assert not result.ok and "invalid choice: 'lmcache'" in result.error
    result = parse_router("vllm-router", ["--vllm-pd-disaggregation", "--kv-connector", "mooncake"])
    assert not result.ok and "requires --prefill" in result.error  # _validate_router_args ran


def test_vllm_router_connector_must_match_the_engines(
    released_facts: ReleasedFacts, parse_router: ParseRouter
) -> None:
    def mutate(children: list[Obj]) -> None:
        router = _container(children, "-router")[1]
        command = list(router["command"])
        if "--kv-connector" in command:
            at = command.index("--kv-connector")
            del command[at : at + 2]
        router["command"] = [*command, "--kv-connector", "moriio"]

    new = _new_findings(_children(_first_accepted("vllm")), mutate, released_facts, parse_router)
    assert ("router", "--kv-connector moriio") in _kinds(new)


def test_cli_prints_each_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _first_accepted("vllm")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(doc))
    assert main(["conformance", "-f", str(good), "--no-router-parser"]) == 0
    doc["spec"]["engine"]["args"] = ["--enable-prefix-cachin"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    assert main(["conformance", "-f", str(bad), "--no-router-parser"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # the flag is passed to both pools
    assert all("flag --enable-prefix-cachin:" in line for line in lines)
    assert "did you mean --enable-prefix-caching?" in lines[0]


def test_sglang_metrics_need_enable_metrics(released_facts: ReleasedFacts) -> None:
    assert released_facts.engines["sglang"].route_requires == {"/metrics": "--enable-metrics"}

    def mutate(children: list[Obj]) -> None:
        engine = _container(children, "-decode")[1]
        engine["args"] = [a for a in engine["args"] if a != "--enable-metrics"]

    new = _new_findings(_children(_first_accepted("sglang")), mutate, released_facts)
    assert _kinds(new) == {("annotation", "prometheus.io/path=/metrics")}


def test_router_discovery_must_find_the_pools(
    released_facts: ReleasedFacts, parse_router: ParseRouter
) -> None:
    def mutate(children: list[Obj]) -> None:
        router = _container(children, "-router")[1]
        command = list(router["command"])
        command[command.index("--service-discovery-port") + 1] = "8081"
        at = command.index("--decode-selector") + 1
        command[at] = command[at].rsplit("=", 1)[0] + "=decoder"
        router["command"] = command

    for engine_type in ENGINES:
        children = _children(_first_accepted(engine_type))
        found = {f.item.split(" ")[0] for f in _new_findings(children, mutate, released_facts, parse_router)}
        assert found == {"--service-discovery-port", "--decode-selector"}, engine_type


def test_image_of_another_version_is_found(released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        _container(children, "-prefill")[1]["image"] = "lmsysorg/sglang:v0.5.22"
        _container(children, "-router")[1]["image"] = "lmsysorg/sglang:v0.5.23"  # not the router's release

    new = _new_findings(_children(_first_accepted("sglang")), mutate, released_facts)
    assert _kinds(new) == {("image", "lmsysorg/sglang:v0.5.22"), ("image", "lmsysorg/sglang:v0.5.23")}


# ------------------------------------------------------------------ multi-node (LeaderWorkerSet) groups


def _wide_ep(engine: str) -> list[Obj]:
    doc = yaml.safe_load((ROOT / "examples" / f"deepseek-r1-wideep-{engine}.yaml").read_text())
    return render_children(DisaggregatedDeployment.model_validate(doc))


def _worker(children: list[Obj], role: str) -> Obj:
    lws = next(c for c in children if c["kind"] == "LeaderWorkerSet" and c["metadata"]["name"].endswith(role))
    container: Obj = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_worker_templates_flags_are_checked(engine: str, released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        worker = _worker(children, "-decode-lws")
        worker["args"] = [*worker["args"], "--made-up-multi-node-flag"]

    new = _new_findings(_wide_ep(engine), mutate, released_facts)
    assert [(f.kind, f.item) for f in new] == [("flag", "--made-up-multi-node-flag")]
    assert new[0].obj.endswith("-decode-lws")


def test_the_vllm_workers_shell_flags_are_checked(released_facts: ReleasedFacts) -> None:
    def mutate(children: list[Obj]) -> None:
        worker = _worker(children, "-prefill-lws")
        worker["command"] = [*worker["command"][:2], worker["command"][2].replace("start-rank", "start-rnk")]

    new = _new_findings(_wide_ep("vllm"), mutate, released_facts)
    # the unknown flag, then its value (worker index 1 x 8 local ranks) as a stray argument
    assert [(f.kind, f.item) for f in new][:1] == [("flag", "--data-parallel-start-rnk")]
    assert "did you mean --data-parallel-start-rank?" in new[0].why


def test_a_router_selecting_workers_is_found(
    released_facts: ReleasedFacts, parse_router: ParseRouter
) -> None:
    def mutate(children: list[Obj]) -> None:
        router = _container(children, "-router")[1]
        router["command"] = [a for a in router["command"] if a != "disagg.dev/group-role=leader"]

    for engine in ("vllm", "sglang"):
        new = _new_findings(_wide_ep(engine), mutate, released_facts, parse_router)
        assert {f.item.split(" ")[0] for f in new} == {"--prefill-selector", "--decode-selector"}, engine
        assert all("serve no HTTP" in f.why for f in new), engine
