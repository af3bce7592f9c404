"""Facts about vLLM, read from its wheel (:func:`extract_vllm`).

vLLM 0.33.0 (``vllm serve``, :func:`vllm_facts`):

- ``vllm/entrypoints/cli/serve.py`` ``ServeSubcommand.subparser_init`` builds the parser with
  ``make_arg_parser`` from ``vllm/entrypoints/common/cli_args.py``: explicit ``add_argument`` calls
  (``--headless``, ``--api-server-count``/``-asc``, ``--config``, ``--grpc``), then
  ``FrontendArgs.add_cli_args`` which adds ``--<field with _ -> ->`` for every dataclass field of
  ``FrontendArgs`` and ``BaseFrontendArgs`` (``get_kwargs(cls)``), then
  ``AsyncEngineArgs.add_cli_args`` (``vllm/engine/arg_utils.py``): explicit option strings whose
  argparse kwargs come from ``get_kwargs(<Config class>)["field"]`` (``vllm/config/*.py``).
  ``_compute_kwargs`` there decides the arity: a bool field becomes ``BooleanOptionalAction``
  (``--x``/``--no-x``), ``bool | str | None`` takes an optional value, ``list``/``tuple``/``set`` take
  ``nargs="+"``, a ``Literal`` without ``str`` becomes ``choices``.
- environment: the keys of ``environment_variables`` in ``vllm/envs.py`` (read lazily by
  ``envs.__getattr__``), plus literal ``os.getenv``/``os.environ`` reads in the KV connector code.
- ``KVTransferConfig`` (``vllm/config/kv_transfer.py``): a pydantic dataclass with ``extra="forbid"``
  (``vllm/config/utils.py`` ``config``), so an unknown key fails ``--kv-transfer-config`` parsing.
- KV connectors: ``KVConnectorFactory.register_connector("Name", ...)`` calls in
  ``vllm/distributed/kv_transfer/kv_connector/factory.py``.
- routes: literal paths of route decorators (``@router.get("/health")``), ``add_api_route`` and
  ``Mount("/metrics", ...)`` under ``vllm/entrypoints/``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from disagg.conformance.engines.wheel import (
    Types,
    WheelSource,
    add_option,
    call_name,
    dedupe,
    explicit_options,
    getenv_literals,
    health_route,
    location,
    route_paths,
    str_literal,
    str_literals,
    vllm_field_spec,
    wheel_name_version,
)
from disagg.conformance.facts import (
    Arity,
    EngineFacts,
    ExtractionError,
    FieldSpec,
    OptionSpec,
)

VLLM_SERVE = "vllm/entrypoints/cli/serve.py"
VLLM_FRONTEND = "vllm/entrypoints/common/cli_args.py"
VLLM_ENGINE_ARGS = "vllm/engine/arg_utils.py"
VLLM_ENVS = "vllm/envs.py"
VLLM_KV_TRANSFER = "vllm/config/kv_transfer.py"
VLLM_KV_FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"
VLLM_CONNECTORS_DIR = "vllm/distributed/kv_transfer/kv_connector/v1"
# Modules under vllm/entrypoints/ that serve their own app on another port, not the API server's routes:
# the data-parallel supervisor's aggregated health server (--data-parallel-supervisor-port) and the
# `vllm preload` helper.
VLLM_OTHER_SERVERS = ("vllm/entrypoints/launchers/dp_supervisor.py", "vllm/entrypoints/cli/preload.py")
# Connectors whose kv_connector_extra_config is also read by another package (LMCache's own vLLM adapter
# in lmcache/integration/vllm/), so the keys vLLM's code reads are not all there are.
CONNECTORS_READ_ELSEWHERE = ("LMCacheConnectorV1", "LMCacheMPConnector")
# Options the renderer relies on; their absence means the extractor no longer understands the wheel.
_VLLM_EXPECTED = ("--host", "--port", "--kv-transfer-config", "--tensor-parallel-size", "--served-model-name")


def _frontend_options(src: WheelSource, types: Types) -> dict[str, OptionSpec]:
    """``--<field>`` for every field of the classes whose ``add_cli_args`` ``make_arg_parser`` calls
    and that generate options from their own dataclass fields (``FrontendArgs``)."""
    tree = src.tree(VLLM_FRONTEND)
    make = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser"), None
    )
    if make is None:
        raise ExtractionError(f"{VLLM_FRONTEND} has no make_arg_parser")
    called = [
        node.func.value.id
        for node in ast.walk(make)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_cli_args"
        and isinstance(node.func.value, ast.Name)
    ]
    generator = _field_generator(types)
    customised = _customisations(tree)
    options: dict[str, OptionSpec] = {}
    for cls in called:
        if cls not in types.classes or types.classes[cls].path != VLLM_FRONTEND:
            continue  # AsyncEngineArgs: explicit option strings, read from arg_utils.py
        if not any(name in generator for name in _mro(types, cls)):
            raise ExtractionError(
                f"{VLLM_FRONTEND}: {cls}.add_cli_args no longer generates --<field> options"
            )
        for field_name, annotation, node, path in types.all_fields(cls):
            spec, negatable = vllm_field_spec(types, annotation, location(path, node))
            custom = customised.get(field_name, _Customised())
            spec = OptionSpec(custom.arity or spec.arity, spec.source, spec.choices)
            add_option(options, ["--" + field_name.replace("_", "-"), *custom.flags], spec, negatable)
    if not options:
        raise ExtractionError(f"{VLLM_FRONTEND}: make_arg_parser adds no generated frontend options")
    return options


def _mro(types: Types, cls: str) -> list[str]:
    info = types.classes.get(cls)
    if info is None:
        return []
    result = [cls]
    for base in info.bases:
        result += _mro(types, base)
    return result


def _field_generator(types: Types) -> set[str]:
    """Classes whose ``add_cli_args`` calls ``get_kwargs(cls)`` and ``add_argument(... f"--{key.replace('_',
    '-')}" ...)`` (``BaseFrontendArgs.add_cli_args`` in vllm/entrypoints/common/cli_args.py)."""
    result: set[str] = set()
    for name, info in types.classes.items():
        for item in info.node.body:
            if not isinstance(item, ast.FunctionDef) or item.name != "add_cli_args":
                continue
            uses_kwargs = any(
                isinstance(n, ast.Call) and call_name(n) == "get_kwargs" for n in ast.walk(item)
            )
            kebab = any(
                isinstance(n, ast.JoinedStr)
                and any(str_literal(v) == "--" for v in n.values)
                and any(
                    isinstance(c, ast.Call)
                    and call_name(c) == "replace"
                    and [str_literal(a) for a in c.args] == ["_", "-"]
                    for c in ast.walk(n)
                )
                for n in ast.walk(item)
            )
            if uses_kwargs and kebab:
                result.add(name)
    return result


@dataclass
class _Customised:
    arity: Arity | None = None
    flags: tuple[str, ...] = ()


def _customisations(tree: ast.Module) -> dict[str, _Customised]:
    """Per generated field, what ``_customize_cli_kwargs`` changes: ``["f"]["flags"] = [...]`` (more
    option strings), ``del ["f"]["nargs"]`` and ``["f"]["action"] = "append"`` (one value each)."""
    result: dict[str, _Customised] = {}

    def key_pair(node: ast.AST) -> tuple[str, str] | None:
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript):
            outer, inner = str_literal(node.slice), str_literal(node.value.slice)
            if outer is not None and inner is not None:
                return inner, outer
        return None

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = list(node.targets), node.value
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            pair = key_pair(target)
            if pair is None:
                continue
            field_name, key = pair
            entry = result.setdefault(field_name, _Customised())
            if key == "flags" and value is not None:
                entry.flags = str_literals(value) or ()
            elif (key == "nargs" and value is None) or (key == "action" and str_literal(value) == "append"):
                entry.arity = "value"
    return result


def extract_vllm(wheel: Path) -> EngineFacts:
    """Read the facts of a vLLM wheel (no cache)."""
    package, version = wheel_name_version(wheel)
    with WheelSource(wheel) as src:
        types = Types()
        for path in src.files("vllm/config/"):
            types.add_module(path, src.tree(path))
        types.add_module(VLLM_FRONTEND, src.tree(VLLM_FRONTEND))
        options: dict[str, OptionSpec] = {}
        for path in (VLLM_SERVE, VLLM_FRONTEND, VLLM_ENGINE_ARGS):
            for name, spec in explicit_options(path, src.tree(path), types).items():
                options.setdefault(name, spec)
        for name, spec in _frontend_options(src, types).items():
            options.setdefault(name, spec)
        missing = [name for name in _VLLM_EXPECTED if name not in options]
        if missing:
            raise ExtractionError(f"{wheel.name}: options {missing} not found; the extractor needs updating")

        env = _vllm_env(src)
        kv_fields = _kv_transfer_fields(src, types)
        registered = _registered_connectors(src)
        connectors = {name: where for name, (where, _) in registered.items()}
        extra_keys: dict[str, tuple[str, ...]] = {}
        for name, (_, module) in registered.items():
            if name in CONNECTORS_READ_ELSEWHERE:
                continue
            found = _extra_config_keys(src, module)
            if found is not None:
                extra_keys[name] = found
        routes: dict[str, str] = {}
        for path in src.files("vllm/entrypoints/"):
            if path in VLLM_OTHER_SERVERS:
                continue
            for route, where in route_paths(path, src.tree(path)).items():
                routes.setdefault(route, where)
        if "/health" not in routes:
            raise ExtractionError(f"{wheel.name}: no /health route found under vllm/entrypoints/")
        health = health_route(
            "vllm/entrypoints/serve/instrumentator/health.py",
            src.tree("vllm/entrypoints/serve/instrumentator/health.py"),
            "/health",
        )
    return EngineFacts(
        package=package,
        version=version,
        wheel=wheel.name,
        options=options,
        env=env,
        routes=routes,
        kv_transfer_fields=kv_fields,
        kv_connectors=connectors,
        kv_extra_config_keys=extra_keys,
        health=(health,) if health else (),
    )


def _vllm_env(src: WheelSource) -> dict[str, str]:
    env: dict[str, str] = {}
    tree = src.tree(VLLM_ENVS)
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(value, ast.Dict)
        ):
            for key in value.keys:
                name = str_literal(key)
                if name:
                    env[name] = location(VLLM_ENVS, key)  # type: ignore[arg-type]
    if not env:
        raise ExtractionError(f"{VLLM_ENVS}: no environment_variables dict found")
    for path in [VLLM_ENVS, *src.files("vllm/distributed/kv_transfer/")]:
        for name, where in getenv_literals(path, src.tree(path)).items():
            env.setdefault(name, where)
    return env


def _kv_transfer_fields(src: WheelSource, types: Types) -> dict[str, FieldSpec]:
    info = types.classes.get("KVTransferConfig")
    if info is None or info.path != VLLM_KV_TRANSFER:
        raise ExtractionError(f"{VLLM_KV_TRANSFER}: no KVTransferConfig class")
    result: dict[str, FieldSpec] = {}
    for name, annotation, node, path in types.all_fields("KVTransferConfig"):
        atoms = types.atoms(annotation)
        values = types.literals(annotation) if "Literal" in atoms and "str" not in atoms else []
        result[name] = FieldSpec(location(path, node), dedupe(values) if values else None)
    return result


def _registered_connectors(src: WheelSource) -> dict[str, tuple[str, str]]:
    """Connector name -> (where it is registered, its module) from ``register_connector(name, module,
    class)`` calls."""
    connectors: dict[str, tuple[str, str]] = {}
    for node in ast.walk(src.tree(VLLM_KV_FACTORY)):
        if isinstance(node, ast.Call) and call_name(node) == "register_connector" and len(node.args) >= 2:
            name, module = str_literal(node.args[0]), str_literal(node.args[1])
            if name and module:
                connectors[name] = (location(VLLM_KV_FACTORY, node), module)
    if not connectors:
        raise ExtractionError(f"{VLLM_KV_FACTORY}: no register_connector(...) calls")
    return connectors


def _extra_config_keys(src: WheelSource, module: str) -> tuple[str, ...] | None:
    """The ``kv_connector_extra_config`` keys a connector's code reads, or None when the set is open
    (it iterates the dict or hands it on whole). Reads: ``get_from_extra_config("k", ...)``,
    ``<...extra_config>.get("k")`` and ``<...extra_config>["k"]``, also through a local name bound to
    ``<...>.kv_connector_extra_config``. The connector's whole package is read (a package module, or
    the package a module lies in below kv_connector/v1/), so helpers in sibling files count."""
    base = module.replace(".", "/")
    parent = base.rpartition("/")[0]
    if src.has(base + "/__init__.py"):
        paths = src.files(base + "/")
    elif parent != VLLM_CONNECTORS_DIR:  # a module of a connector package: read the whole package
        paths = src.files(parent + "/")
    else:
        paths = [base + ".py"]
    keys: list[str] = []
    for path in paths:
        if not src.has(path):
            return None
        for function in ast.walk(src.tree(path)):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            aliases = {
                target.id
                for node in ast.walk(function)
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr.endswith("extra_config")
                for target in node.targets
                if isinstance(target, ast.Name)
            }

            def is_extra(expr: ast.expr, aliases: set[str] = aliases) -> bool:
                if isinstance(expr, ast.Attribute):
                    return expr.attr.endswith("extra_config")
                return isinstance(expr, ast.Name) and (expr.id in aliases or expr.id.endswith("extra_config"))

            for node in ast.walk(function):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                    attr, owner = node.func.attr, node.func.value
                    if attr == "get_from_extra_config" or (attr == "get" and is_extra(owner)):
                        key = str_literal(node.args[0])
                        if key is None:
                            return None
                        keys.append(key)
                    elif attr in ("items", "keys", "values", "update", "copy") and is_extra(owner):
                        return None
                elif isinstance(node, ast.Subscript) and is_extra(node.value):
                    key = str_literal(node.slice)
                    if key is None:
                        return None
                    keys.append(key)
                elif isinstance(node, ast.keyword) and node.arg is None and is_extra(node.value):
                    return None
    return dedupe(sorted(keys)) if keys else None
