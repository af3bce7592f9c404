"""Rendered child manifests against the released software: one :class:`Finding` per mismatch. Pure
except for ``parse_router``, the optional callable that runs a router's real parser (routers.py).

What is checked, per container of every Deployment (recognised by its command line):

- vLLM (``vllm serve MODEL ...``) and SGLang (``python3 -m sglang.launch_server ...``): every option
  is one the release's parser declares (``--flag=value`` split; vLLM's parser also accepts
  ``--flag_name`` and ``--config-name.key value``, which are normalised the way its
  ``FlexibleArgumentParser.parse_args`` does), takes a value when it needs one and none when it is a
  flag, and a value is one of the declared ``choices``. vLLM's ``--kv-transfer-config`` JSON: every key
  is a ``KVTransferConfig`` field (unknown keys are rejected: ``extra="forbid"``), ``kv_role`` and
  ``kv_load_failure_policy`` take one of their ``Literal`` values, ``kv_connector`` is a registered
  connector and every ``kv_connector_extra_config`` key is one its code reads (an unknown key is
  silently ignored by vLLM; connectors whose keys are also read elsewhere, LMCache, are not checked).
- environment: every variable is read by the engine (facts.env) or is in :data:`ALLOWED_ENV` /
  :data:`ALLOWED_ENV_PREFIXES` (read by a library, or only there for ``$(VAR)`` expansion); every
  ``$(VAR)`` in command, args or env values names a variable defined in the container.
- probes and the ``prometheus.io/path`` annotation: an HTTP route the engine (or router) serves, on a
  named container port; SGLang's ``/health`` runs a one-token generation and sleeps at least one second
  first (sglang/srt/entrypoints/http_server.py ``health_generate``), so a probe on it needs
  ``timeoutSeconds`` above that unless the container sets ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``
  to false.
- images: the container's image tag is the version the facts come from (a custom image is reported:
  what it runs was not checked).
- LeaderWorkerSets (multi-node replicas): the leader and worker templates are checked like a
  Deployment's, with the variables the LeaderWorkerSet webhook adds to every container (LWS_LEADER_ADDRESS,
  LWS_GROUP_SIZE, LWS_WORKER_INDEX) defined; a worker's ``sh -c 'exec "$0" "$@" FLAGS' PROGRAM ARGS...``
  wrapper is unwrapped (PROGRAM ARGS... FLAGS, ``$((VAR * N))`` evaluated) so its engine flags are checked
  too. Workers serve no HTTP: the router must not select them, and only leaders pair with it.
- routers: the whole argv is parsed by the released router's own launcher (``parse_router``); the
  prefill pods of a deployment carry the bootstrap-port annotation the deployed router reads
  (``RouterArgs.bootstrap_port_annotation``), with the port the engine's bootstrap server listens on;
  vllm-router's ``--kv-connector`` names the protocol of the engines' connector; with
  ``--service-discovery``, the parsed ``--prefill-selector``/``--decode-selector`` select the pools' pod
  labels, ``--service-discovery-port`` is the engines' ``--port`` and the namespace theirs.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from disagg.conformance.facts import EngineFacts, OptionSpec, RouterFacts
from disagg.conformance.routers import RouterParse, launcher_module, router_serves

Obj = dict[str, Any]
ParseRouter = Callable[[str, list[str]], RouterParse]

# Environment variables the engines do not read themselves but that are right to set on their pods.
ALLOWED_ENV_PREFIXES: Mapping[str, str] = {
    "UCX_": "UCX, the transport under NIXL and Mooncake (e.g. UCX_NET_DEVICES picks the RDMA NIC)",
    "NCCL_": "NCCL (collectives between tensor-parallel ranks)",
    "LMCACHE_": "LMCache: every configuration key can be set as LMCACHE_<KEY> (its config loader)",
}
ALLOWED_ENV: Mapping[str, str] = {
    "HF_TOKEN": "huggingface_hub (gated model downloads)",
    "HF_HOME": "huggingface_hub (cache location)",
    # spec.model.cache: the cache directory on the claim, and no download (huggingface_hub 1.31.0
    # constants.py HF_HUB_CACHE, HF_HUB_OFFLINE; vLLM and SGLang pass local_files_only=HF_HUB_OFFLINE).
    "HF_HUB_CACHE": "huggingface_hub (the hub cache directory: the model cache claim)",
    "HF_HUB_OFFLINE": "huggingface_hub (offline mode: weights only from the cache, never downloaded)",
    "POD_NAMESPACE": "downward API, for $(POD_NAMESPACE) expansion by the kubelet",
    "POD_IP": "downward API, for $(POD_IP) expansion by the kubelet",
}
# vllm-router --kv-connector value for each vLLM connector whose P/D protocol it speaks
# (vllm_router/router_args.py: choices nixl, mooncake, moriio).
VLLM_ROUTER_PROTOCOL = {"NixlConnector": "nixl", "MooncakeConnector": "mooncake", "MoRIIOConnector": "moriio"}
# Stand-ins for downward-API values when expanding $(VAR).
_FIELD_VALUES = {"status.podIP": "10.0.0.1", "status.hostIP": "10.0.0.2", "spec.nodeName": "node-0"}
_EXPANSION = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"
_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
_KUBERNETES_PROBE_TIMEOUT_DEFAULT = 1  # seconds (core/v1 Probe.timeoutSeconds default)
_DEFAULT_BOOTSTRAP_PORT = (
    8998  # SGLang --disaggregation-bootstrap-port and VLLM_MOONCAKE_BOOTSTRAP_PORT defaults
)


@dataclass(frozen=True)
class Finding:
    obj: str  # "Deployment/name"
    container: str
    kind: str  # flag | value | kv-transfer-config | env | expansion | probe | annotation | router
    item: str  # the flag, key, variable, path or annotation
    why: str

    def __str__(self) -> str:
        where = f"{self.obj} container {self.container}" if self.container else self.obj
        return f"{where}: {self.kind} {self.item}: {self.why}"


@dataclass(frozen=True)
class ReleasedFacts:
    """Everything the check compares against, one entry per released package."""

    engines: Mapping[str, EngineFacts]  # "vllm", "sglang"
    routers: Mapping[str, RouterFacts]  # "vllm-router", "sglang-router"


@dataclass
class _Engine:
    """One engine container as the check sees it."""

    obj: str
    container: Obj
    engine: str  # "vllm" | "sglang"
    argv: list[str]  # after $(VAR) expansion
    options: dict[str, list[str]]  # option -> values given
    annotations: dict[str, str]
    labels: dict[str, str]
    namespace: str
    worker: bool = False  # a LeaderWorkerSet worker pod: serves no HTTP, never routed to


# LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): the templates of a group, and the variables its pod webhook
# adds to every container (kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go:
# LwsLeaderAddress, LwsGroupSize, LwsWorkerIndex), with stand-in values for $(VAR) expansion.
LWS_KIND = "LeaderWorkerSet"
# A worker's shell wrapper: the argv after the script, then the script's own flags (disagg.render vLLM).
_SHELLS = ("sh", "bash")
_WRAPPER = re.compile(r'^exec "\$0" "\$@"(?P<rest>( [^;&|`]*)?)$')
_ARITHMETIC = re.compile(r"\$\(\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\*\s*([0-9]+)\s*\)\)")


def _lws_env(obj: Obj, worker: bool) -> dict[str, str]:
    name = obj.get("metadata", {}).get("name", "lws")
    namespace = obj.get("metadata", {}).get("namespace") or "default"
    size = (obj.get("spec", {}).get("leaderWorkerTemplate") or {}).get("size", 1)
    return {
        "LWS_LEADER_ADDRESS": f"{name}-0.{name}.{namespace}",
        "LWS_GROUP_SIZE": str(size),
        "LWS_WORKER_INDEX": "1" if worker else "0",
    }


def unwrap_shell(argv: list[str], env: Mapping[str, str]) -> tuple[list[str], str | None]:
    """``[sh, -c, 'exec "$0" "$@" FLAGS', PROGRAM, ARGS...]`` -> ``[PROGRAM, ARGS..., FLAGS...]`` with
    ``$((VAR * N))`` evaluated from ``env``; other argv unchanged. The second value says why a shell
    wrapper could not be read (then the argv is returned as it was)."""
    if len(argv) < 4 or PurePosixPath(argv[0]).name not in _SHELLS or argv[1] != "-c":
        return argv, None
    match = _WRAPPER.match(argv[2])
    if match is None:
        return argv, f'a shell script other than \'exec "$0" "$@" FLAGS\': {argv[2]!r}'

    def evaluate(found: re.Match[str]) -> str:
        value = env.get(found.group(1))
        return (
            str(int(value) * int(found.group(2))) if value is not None and value.isdigit() else found.group(0)
        )

    rest = _ARITHMETIC.sub(evaluate, match.group("rest") or "")
    try:
        flags = shlex.split(rest)
    except ValueError as error:
        return argv, f"unreadable shell flags {rest!r}: {error}"
    if any("$" in flag for flag in flags):
        return argv, f"a shell expansion the check can't evaluate in {rest!r}"
    return [*argv[3:], *flags], None


# ------------------------------------------------------------------------------------------ helpers


def _obj_name(obj: Obj) -> str:
    return f"{obj.get('kind', '?')}/{obj.get('metadata', {}).get('name', '?')}"


def _pod_templates(children: list[Obj]) -> Iterator[tuple[Obj, Obj, bool | None]]:
    """(object, pod template, whether it is a LeaderWorkerSet's worker template: None outside one)."""
    for obj in children:
        if obj.get("kind") == LWS_KIND:
            group = obj.get("spec", {}).get("leaderWorkerTemplate") or {}
            worker = group.get("workerTemplate")
            leader = group.get("leaderTemplate") or worker  # the worker template when not given
            if isinstance(leader, dict):
                yield obj, leader, False
            if isinstance(worker, dict) and int(group.get("size", 1)) > 1:
                yield obj, worker, True
            continue
        template = obj.get("spec", {}).get("template")
        if obj.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job") and isinstance(
            template, dict
        ):
            yield obj, template, None


def _env_values(container: Obj, namespace: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item.get("name", "")
        if "value" in item:
            values[name] = str(item["value"])
        else:
            ref = (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            if ref == "metadata.namespace":
                values[name] = namespace
            else:
                values[name] = _FIELD_VALUES.get(str(ref), f"<{name}>")
    return values


def expand(text: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The kubelet's ``$(VAR)`` expansion: defined variables replaced, ``$$`` escapes, undefined ones
    left verbatim (and returned, since the program then sees the literal ``$(VAR)``)."""
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        start = match.start()
        if start > 0 and text[start - 1] == "$":
            return match.group(0)
        name = match.group(1)
        if name in env:
            return env[name]
        missing.append(name)
        return match.group(0)

    return _EXPANSION.sub(replace, text).replace("$$(", "$("), missing


def _engine_of(argv: list[str]) -> str | None:
    if not argv:
        return None
    program = PurePosixPath(argv[0]).name
    if program == "vllm" and argv[1:2] == ["serve"]:
        return "vllm"
    if program.startswith("python") and argv[1:3] == ["-m", "sglang.launch_server"]:
        return "sglang"
    if program == "sglang" and argv[1:2] == ["serve"]:
        return "sglang"
    return None


def _router_of(argv: list[str]) -> str | None:
    if not argv:
        return None
    program = PurePosixPath(argv[0]).name
    if program == "vllm-router" or (
        program.startswith("python") and argv[1:3] == ["-m", "vllm_router.launch_router"]
    ):
        return "vllm-router"
    if (
        program.startswith("python")
        and argv[1:2] == ["-m"]
        and argv[2:3]
        and argv[2].startswith("sglang_router.")
    ):
        return "sglang-router"
    return None


def _image_tag(image: str) -> str | None:
    """``"vllm/vllm-openai:v0.33.0"`` -> ``"0.33.0"``; None without a tag (or with a digest only)."""
    _, sep, tag = image.split("@", 1)[0].rpartition(":")
    if not sep or "/" in tag or not tag:
        return None
    return tag[1:] if tag.startswith("v") else tag


def _check_image(obj: str, container: Obj, package: str, version: str) -> list[Finding]:
    image = str(container.get("image", ""))
    tag = _image_tag(image)
    if tag == version:
        return []
    return [
        Finding(
            obj,
            container.get("name", ""),
            "image",
            image,
            f"the conformance facts are {package} {version}'s; this image runs {tag or 'an untagged build'}",
        )
    ]


def _suggest(name: str, options: Mapping[str, OptionSpec]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


# ---------------------------------------------------------------------------------- command lines


def _normalise_vllm(name: str) -> tuple[str, str | None]:
    """vLLM's FlexibleArgumentParser: ``--a_b`` is ``--a-b``; ``--cfg.key`` sets one key of ``--cfg``."""
    if name.startswith("--"):
        head, dot, rest = name[2:].partition(".")
        return "--" + head.replace("_", "-"), rest if dot else None
    return name, None


def parse_engine_argv(
    facts: EngineFacts, argv: list[str], positionals: int
) -> tuple[dict[str, list[str]], list[tuple[str, str, str]]]:
    """Options and their values in ``argv`` (after the program and subcommand), and the problems:
    ``(kind, item, why)``. ``positionals`` is how many positional arguments the program takes."""
    options: dict[str, list[str]] = {}
    problems: list[tuple[str, str, str]] = []
    seen_positional = 0
    i = 0
    label = f"{facts.package} {facts.version}"
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("-") or token == "-" or _is_number(token):
            seen_positional += 1
            if seen_positional > positionals:
                problems.append(
                    (
                        "flag",
                        token,
                        f"{label} takes no positional argument here (a value without its option?)",
                    )
                )
            continue
        name, inline = token, None
        if "=" in token:
            name, inline = token.split("=", 1)
        key: str | None = None
        if facts.package == "vllm":
            # -O3, -O=3 and -O 3 are --optimization-level (FlexibleArgumentParser.parse_args)
            if name.startswith("-O") and not name.startswith("--"):
                if name != "-O":
                    name, inline = "--optimization-level", token[2:].lstrip("=")
                elif inline is not None or argv[i : i + 1] in (["0"], ["1"], ["2"], ["3"]):
                    name = "--optimization-level"
            name, key = _normalise_vllm(name)
        spec = facts.options.get(name)
        if spec is None:
            problems.append(("flag", name, f"{label} has no option {name}{_suggest(name, facts.options)}"))
            continue
        values: list[str] = []
        arity = "value" if key is not None else spec.arity
        if inline is not None:
            if arity == "flag":
                problems.append(("value", name, f"{name} is a flag and takes no value ({spec.source})"))
            values.append(inline)
        elif arity == "value":
            if i < len(argv) and (not argv[i].startswith("-") or _is_number(argv[i])):
                values.append(argv[i])
                i += 1
            else:
                problems.append(("value", name, f"{name} needs a value ({spec.source})"))
        elif arity in ("optional", "list"):
            while i < len(argv) and (not argv[i].startswith("-") or _is_number(argv[i])):
                values.append(argv[i])
                i += 1
                if arity == "optional":
                    break
            if arity == "list" and not values:
                problems.append(("value", name, f"{name} needs at least one value ({spec.source})"))
        if spec.choices is not None and key is None:
            for value in values:
                if value not in spec.choices:
                    problems.append(
                        ("value", f"{name} {value}", f"not one of {list(spec.choices)} ({spec.source})")
                    )
        full = f"{name}.{key}" if key is not None else name
        options.setdefault(full, []).extend(values)
    return options, problems


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _check_kv_transfer(facts: EngineFacts, options: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    problems: list[tuple[str, str, str]] = []
    config: Obj = {}
    for value in options.get("--kv-transfer-config", []):
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            problems.append(("kv-transfer-config", value[:60], f"not JSON: {exc}"))
            continue
        if not isinstance(parsed, dict):
            problems.append(("kv-transfer-config", value[:60], "not a JSON object"))
            continue
        config.update(parsed)
    for name, values in options.items():
        if name.startswith("--kv-transfer-config."):
            config[name.split(".", 2)[1]] = values[-1] if values else None
    if not config:
        return problems
    fields = facts.kv_transfer_fields
    source = next(iter(fields.values())).source.split(":")[0] if fields else "KVTransferConfig"
    for key, value in config.items():
        spec = fields.get(key)
        if spec is None:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(
                (
                    "kv-transfer-config",
                    key,
                    f"not a KVTransferConfig field ({source}; extra keys are forbidden){hint}",
                )
            )
        elif spec.choices is not None and value is not None and str(value) not in spec.choices:
            problems.append(
                ("kv-transfer-config", f"{key}={value}", f"not one of {list(spec.choices)} ({spec.source})")
            )
    connector = config.get("kv_connector")
    if (
        connector is not None
        and "kv_connector_module_path" not in config
        and connector not in facts.kv_connectors
    ):
        problems.append(
            (
                "kv-transfer-config",
                f"kv_connector={connector}",
                f"{facts.package} {facts.version} registers no such connector ({_FACTORY} "
                f"registers {sorted(facts.kv_connectors)})",
            )
        )
    extra = config.get("kv_connector_extra_config")
    known = facts.kv_extra_config_keys.get(str(connector))
    if isinstance(extra, dict) and known is not None:
        for key in extra:
            if key not in known:
                close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(
                    (
                        "kv-transfer-config",
                        f"kv_connector_extra_config.{key}",
                        f"{connector} in {facts.package} {facts.version} reads only {list(known)}{hint}",
                    )
                )
    return problems


# ------------------------------------------------------------------------------------------- checks


def _check_env(obj: str, container: Obj, facts_env: Mapping[str, str], label: str) -> list[Finding]:
    findings = []
    for item in container.get("env") or []:
        name = str(item.get("name", ""))
        if name in facts_env or name in ALLOWED_ENV or any(name.startswith(p) for p in ALLOWED_ENV_PREFIXES):
            continue
        close = difflib.get_close_matches(name, [*facts_env, *ALLOWED_ENV], n=1, cutoff=0.85)
        hint = f" (did you mean {close[0]}?)" if close else ""
        findings.append(
            Finding(
                obj,
                container.get("name", ""),
                "env",
                name,
                f"{label} does not read it and no allowed library does{hint}",
            )
        )
    return findings


def _check_probes(
    obj: str, container: Obj, serves: Callable[[str], bool], label: str, facts: EngineFacts | None
) -> list[Finding]:
    findings = []
    name = container.get("name", "")
    ports = {p.get("name") for p in container.get("ports") or []}
    env = {item.get("name"): item.get("value") for item in container.get("env") or []}
    for probe_name in _PROBES:
        probe = container.get(probe_name)
        if not isinstance(probe, dict) or "httpGet" not in probe:
            continue
        path = str(probe["httpGet"].get("path", "/"))
        port = probe["httpGet"].get("port")
        route = path.split("?", 1)[0]
        if not serves(route):
            findings.append(
                Finding(obj, name, "probe", f"{probe_name} {path}", f"{label} serves no such route")
            )
        if isinstance(port, str) and port not in ports:
            findings.append(
                Finding(obj, name, "probe", f"{probe_name} port {port}", "no container port has that name")
            )
        for health in facts.health if facts else ():
            if health.path != route or not health.generates:
                continue
            if health.disabled_by_env and str(env.get(health.disabled_by_env, "")).lower() in ("0", "false"):
                continue
            timeout = int(probe.get("timeoutSeconds", _KUBERNETES_PROBE_TIMEOUT_DEFAULT))
            if timeout <= health.min_seconds:
                switch = f", or set {health.disabled_by_env}=false" if health.disabled_by_env else ""
                findings.append(
                    Finding(
                        obj,
                        name,
                        "probe",
                        f"{probe_name} {path} timeoutSeconds={timeout}",
                        f"{label}'s {route} runs a one-token generation and sleeps {health.min_seconds:g} s "
                        f"before it can answer ({health.source}); the probe times out first: raise "
                        f"timeoutSeconds{switch}",
                    )
                )
    return findings


def _check_engine_container(
    obj: Obj, template: Obj, container: Obj, argv: list[str], facts: EngineFacts
) -> tuple[_Engine, list[Finding]]:
    name = _obj_name(obj)
    cname = container.get("name", "")
    label = f"{facts.package} {facts.version}"
    if facts.package == "vllm":
        rest, positionals = argv[2:], 1  # vllm serve [MODEL] ...
    elif PurePosixPath(argv[0]).name == "sglang":
        rest, positionals = argv[2:], 0
    else:
        rest, positionals = argv[3:], 0  # python3 -m sglang.launch_server ...
    options, problems = parse_engine_argv(facts, rest, positionals)
    if facts.package == "vllm":
        problems += _check_kv_transfer(facts, options)
    findings = [Finding(name, cname, kind, item, why) for kind, item, why in problems]
    findings += _check_image(name, container, facts.package, facts.version)
    findings += _check_env(name, container, facts.env, label)
    findings += _check_probes(name, container, facts.routes.__contains__, label, facts)
    annotations = dict(template.get("metadata", {}).get("annotations") or {})
    metrics_path = annotations.get("prometheus.io/path")
    if metrics_path is not None and metrics_path not in facts.routes:
        findings.append(
            Finding(
                name,
                cname,
                "annotation",
                f"prometheus.io/path={metrics_path}",
                f"{label} serves no such route",
            )
        )
    used = [("annotation", f"prometheus.io/path={metrics_path}", metrics_path)]
    used += [
        ("probe", f"{probe} {_probe_path(container, probe)}", _probe_path(container, probe))
        for probe in _PROBES
    ]
    for kind, item, path in used:
        option = facts.route_requires.get(path or "")
        if option is not None and option not in options:
            why = f"{label} mounts {path} only with {option}, which is not given"
            findings.append(Finding(name, cname, kind, item, why))
    labels = dict(template.get("metadata", {}).get("labels") or {})
    namespace = str(obj.get("metadata", {}).get("namespace") or "default")
    engine = _Engine(name, container, facts.package, argv, options, annotations, labels, namespace)
    return engine, findings


def _probe_path(container: Obj, probe: str) -> str | None:
    spec = container.get(probe)
    if isinstance(spec, dict) and isinstance(spec.get("httpGet"), dict):
        return str(spec["httpGet"].get("path", "/")).split("?", 1)[0]
    return None


def _kv_config(engine: _Engine) -> Obj:
    config: Obj = {}
    for value in engine.options.get("--kv-transfer-config", []):
        try:
            parsed = json.loads(value)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            config.update(parsed)
    return config


def _is_prefill(engine: _Engine) -> bool:
    if engine.engine == "sglang":
        return engine.options.get("--disaggregation-mode", [""])[-1] == "prefill"
    return _kv_config(engine).get("kv_role") == "kv_producer"


def _bootstrap_port(engine: _Engine) -> int | None:
    """The port the prefill's bootstrap server listens on, None when its connector has none."""
    if engine.engine == "sglang":
        values = engine.options.get("--disaggregation-bootstrap-port")
        return int(values[-1]) if values else _DEFAULT_BOOTSTRAP_PORT
    if _kv_config(engine).get("kv_connector") != "MooncakeConnector":
        return None
    env = {item.get("name"): item.get("value") for item in engine.container.get("env") or []}
    value = env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT")
    return int(value) if value is not None else _DEFAULT_BOOTSTRAP_PORT


def _check_pairing(
    engines: list[_Engine],
    routers: list[tuple[str, str, Obj, list[str], RouterParse | None]],
    facts: ReleasedFacts,
) -> list[Finding]:
    findings: list[Finding] = []
    workers = [engine for engine in engines if engine.worker]
    engines = [engine for engine in engines if not engine.worker]  # a worker is never routed to
    for router_obj, package, router_container, _argv, parsed in routers:
        router_name = str(router_container.get("name", ""))
        router = facts.routers[package]
        wanted = router.bootstrap_port_annotation
        for engine in engines:
            if not _is_prefill(engine):
                continue
            port = _bootstrap_port(engine)
            for key in engine.annotations:
                if key.endswith("/bootstrap-port") and key != wanted:
                    findings.append(
                        Finding(
                            engine.obj,
                            engine.container.get("name", ""),
                            "annotation",
                            key,
                            f"{package} {router.version} (deployed by {router_obj}) reads the bootstrap port "
                            f"from {wanted} ({router.annotation_source}), not {key}",
                        )
                    )
            if port is None:
                continue
            given = engine.annotations.get(wanted)
            if given is None:
                findings.append(
                    Finding(
                        engine.obj,
                        engine.container.get("name", ""),
                        "annotation",
                        wanted,
                        f"missing: {package} {router.version} discovers this prefill pod's bootstrap port "
                        f"({port}) from it ({router.annotation_source})",
                    )
                )
            elif given != str(port):
                findings.append(
                    Finding(
                        engine.obj,
                        engine.container.get("name", ""),
                        "annotation",
                        f"{wanted}={given}",
                        f"the engine's bootstrap server listens on {port}",
                    )
                )
        if package == "vllm-router" and parsed is not None and parsed.ok:
            protocol = parsed.args.get("kv_connector")
            for engine in engines:
                connector = _kv_config(engine).get("kv_connector")
                if engine.engine != "vllm" or connector is None:
                    continue
                if VLLM_ROUTER_PROTOCOL.get(str(connector)) != protocol:
                    findings.append(
                        Finding(
                            router_obj,
                            router_name,
                            "router",
                            f"--kv-connector {protocol}",
                            f"the engines in {engine.obj} use {connector}; vllm-router {router.version} "
                            f"speaks {', '.join(f'{c} ({p})' for c, p in VLLM_ROUTER_PROTOCOL.items())} only",
                        )
                    )
                    break
        if parsed is not None and parsed.ok and parsed.args.get("service_discovery"):
            findings += _check_discovery(router_obj, router_name, package, router, parsed, engines)
            findings += _check_leaders_only(router_obj, router_name, parsed, workers)
        for engine in engines:
            expected = "vllm" if package == "vllm-router" else "sglang"
            if engine.engine != expected:
                findings.append(
                    Finding(
                        router_obj,
                        router_name,
                        "router",
                        package,
                        f"routes {engine.engine} engines ({engine.obj}); it is {expected}'s router",
                    )
                )
                break
    return findings


def _check_discovery(
    router_obj: str,
    router_name: str,
    package: str,
    router: RouterFacts,
    parsed: RouterParse,
    engines: list[_Engine],
) -> list[Finding]:
    """Kubernetes discovery as the router parsed it (``RouterArgs`` after ``from_cli_args``) finds the
    engine pods: the role's selector matches their labels, in their namespace, on their HTTP port."""
    findings: list[Finding] = []
    label = f"{package} {router.version}"
    port = parsed.args.get("service_discovery_port")
    namespace = parsed.args.get("service_discovery_namespace")
    for engine in engines:
        role = "prefill" if _is_prefill(engine) else "decode"
        selector = parsed.args.get(f"{role}_selector") or {}
        if not isinstance(selector, dict) or not selector:
            findings.append(
                Finding(
                    router_obj, router_name, "router", f"--{role}-selector", f"{label} got no {role} selector"
                )
            )
        elif not _selects(selector, engine.labels):
            findings.append(
                Finding(
                    router_obj,
                    router_name,
                    "router",
                    _selector_flag(role, selector),
                    f"does not select the pods of {engine.obj} (labels {engine.labels})",
                )
            )
        given = engine.options.get("--port")
        if given and port is not None and str(port) != given[-1]:
            findings.append(
                Finding(
                    router_obj,
                    router_name,
                    "router",
                    f"--service-discovery-port {port}",
                    f"{engine.obj} serves HTTP on {given[-1]}",
                )
            )
        if namespace is not None and namespace != engine.namespace:
            findings.append(
                Finding(
                    router_obj,
                    router_name,
                    "router",
                    f"--service-discovery-namespace {namespace}",
                    f"{engine.obj} runs in {engine.namespace}",
                )
            )
    return findings


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a router's label selector picks pods with these labels."""
    return all(labels.get(key) == value for key, value in selector.items())


def _selector_flag(role: str, selector: Mapping[str, str]) -> str:
    return f"--{role}-selector {' '.join(f'{k}={v}' for k, v in selector.items())}"


def _check_leaders_only(
    router_obj: str, router_name: str, parsed: RouterParse, workers: list[_Engine]
) -> list[Finding]:
    """The router's discovery selects no LeaderWorkerSet worker (it serves no HTTP: the leader serves the
    group)."""
    findings: list[Finding] = []
    for engine in workers:
        for role in ("prefill", "decode"):
            selector = parsed.args.get(f"{role}_selector") or {}
            if isinstance(selector, dict) and selector and _selects(selector, engine.labels):
                findings.append(
                    Finding(
                        router_obj,
                        router_name,
                        "router",
                        _selector_flag(role, selector),
                        f"selects the worker pods of {engine.obj}, which serve no HTTP (only the leaders do)",
                    )
                )
    return findings


def check_children(
    children: list[Obj], facts: ReleasedFacts, parse_router: ParseRouter | None = None
) -> list[Finding]:
    """Every mismatch between the rendered ``children`` of one DisaggregatedDeployment and the
    released software (see the module docstring).

    ``parse_router(package, argv)`` runs the router's real parser (e.g.
    ``lambda p, a: parse_router_command(p, versions[p], a)``); without it router argv is not checked.
    """
    findings: list[Finding] = []
    engines: list[_Engine] = []
    routers: list[tuple[str, str, Obj, list[str], RouterParse | None]] = []
    for obj, template, worker in _pod_templates(children):
        namespace = str(obj.get("metadata", {}).get("namespace") or "default")
        for container in template.get("spec", {}).get("containers") or []:
            env = {
                **(_lws_env(obj, bool(worker)) if worker is not None else {}),
                **_env_values(container, namespace),
            }
            raw = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
            argv: list[str] = []
            for arg in raw:
                expanded, missing = expand(arg, env)
                argv.append(expanded)
                findings += [
                    Finding(
                        _obj_name(obj),
                        container.get("name", ""),
                        "expansion",
                        f"$({var})",
                        "not defined in the container's env, so the program gets it verbatim",
                    )
                    for var in missing
                ]
            argv, unreadable = unwrap_shell(argv, env)
            if unreadable is not None:
                findings.append(
                    Finding(_obj_name(obj), container.get("name", ""), "shell", argv[0], unreadable)
                )
            engine = _engine_of(argv)
            router = _router_of(argv)
            if engine is not None and engine in facts.engines:
                parsed_engine, found = _check_engine_container(
                    obj, template, container, argv, facts.engines[engine]
                )
                parsed_engine.worker = bool(worker)
                engines.append(parsed_engine)
                findings += found
            elif router is not None and router in facts.routers:
                findings += _check_router_container(
                    obj, template, container, argv, router, facts, parse_router, routers
                )
    findings += _check_pairing(engines, routers, facts)
    return findings


def _check_router_container(
    obj: Obj,
    template: Obj,
    container: Obj,
    argv: list[str],
    package: str,
    facts: ReleasedFacts,
    parse_router: ParseRouter | None,
    routers: list[tuple[str, str, Obj, list[str], RouterParse | None]],
) -> list[Finding]:
    name = _obj_name(obj)
    cname = container.get("name", "")
    router = facts.routers[package]
    label = f"{package} {router.version}"
    findings: list[Finding] = _check_image(name, container, package, router.version)
    parsed: RouterParse | None = None
    if parse_router is not None:
        _, router_argv = launcher_module(package, argv)
        parsed = parse_router(package, router_argv)
        if not parsed.ok:
            findings.append(
                Finding(
                    name,
                    cname,
                    "router",
                    " ".join(router_argv)[:80] + " ...",
                    f"{label}'s parser: {parsed.error}",
                )
            )
    findings += _check_probes(name, container, lambda path: router_serves(router, path), label, None)
    annotations = template.get("metadata", {}).get("annotations") or {}
    metrics_path = annotations.get("prometheus.io/path")
    if metrics_path is not None and not router_serves(router, metrics_path):
        findings.append(
            Finding(
                name,
                cname,
                "annotation",
                f"prometheus.io/path={metrics_path}",
                f"{label} serves no such route",
            )
        )
    routers.append((name, package, container, argv, parsed))
    return findings
