"""Facts about SGLang, read from its wheel (:func:`extract_sglang`).

SGLang 0.5.23 (``python -m sglang.launch_server``, :func:`sglang_facts`): ``sglang/launch_server.py``
calls ``prepare_server_args`` (``sglang/srt/server_args.py``), a plain ``argparse.ArgumentParser`` with
``ServerArgs.add_cli_args``: ``add_cli_args_from_dataclass`` (``sglang/srt/arg_groups/arg_utils.py``)
registers every ``A[T, "help"]``/``A[T, Arg(...)]`` field of the namespace classes listed in
``_INPUT_NAMESPACES`` (``sglang/srt/arg_groups/fields/*.py``) as ``Arg.cli_name`` or
``--<field with _ -> ->`` plus ``Arg.aliases``, skipping ``no_cli``; then explicit ``add_argument`` calls.
Environment: the ``Envs`` class attributes in ``sglang/srt/environ.py`` plus literal ``os.getenv`` reads.
Routes: ``sglang/srt/entrypoints/http_server.py`` decorators and the ``Mount("/metrics")`` of
``sglang/srt/utils/common.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from disagg.conformance.engines.wheel import (
    Types,
    WheelSource,
    add_option,
    arity_from_keywords,
    call_keywords,
    call_name,
    dedupe,
    explicit_options,
    getenv_literals,
    health_route,
    location,
    route_paths,
    str_literal,
    str_literals,
    subscript_args,
    subscript_base,
    wheel_name_version,
)
from disagg.conformance.facts import (
    Arity,
    EngineFacts,
    ExtractionError,
    OptionSpec,
)

SGLANG_SERVER_ARGS = "sglang/srt/server_args.py"
SGLANG_FIELDS = "sglang/srt/arg_groups/fields/"
SGLANG_CHOICES = "sglang/srt/arg_groups/choices.py"
SGLANG_ENVIRON = "sglang/srt/environ.py"
SGLANG_HTTP = "sglang/srt/entrypoints/http_server.py"
SGLANG_COMMON = "sglang/srt/utils/common.py"
_SGLANG_EXPECTED = (
    "--model-path",
    "--port",
    "--tp-size",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
)


def _sglang_field_options(
    src: WheelSource, types: Types, lists: dict[str, tuple[str, ...]]
) -> dict[str, OptionSpec]:
    """What ``add_cli_args_from_dataclass`` (sglang/srt/arg_groups/arg_utils.py) registers for the
    fields of every class in ``_INPUT_NAMESPACES`` and of ``ServerArgs`` itself."""
    tree = src.tree(SGLANG_SERVER_ARGS)
    namespaces: list[str] = []
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
            and isinstance(node.value, ast.List | ast.Tuple)
        ):
            namespaces = [elt.id for elt in node.value.elts if isinstance(elt, ast.Name)]
    if not namespaces:
        raise ExtractionError(f"{SGLANG_SERVER_ARGS}: no _INPUT_NAMESPACES list")
    options: dict[str, OptionSpec] = {}
    for cls in [*namespaces, "ServerArgs"]:
        info = types.classes.get(cls)
        if info is None:
            raise ExtractionError(f"{cls} (in _INPUT_NAMESPACES) not found under {SGLANG_FIELDS}")
        for field_name, annotation, node in info.fields:
            spec = _sglang_field(types, lists, field_name, annotation, location(info.path, node))
            if spec is not None:
                names, option = spec
                add_option(options, names, option, False)
    return options


def _sglang_field(
    types: Types, lists: dict[str, tuple[str, ...]], name: str, annotation: ast.expr, source: str
) -> tuple[list[str], OptionSpec] | None:
    if subscript_base(annotation) not in ("A", "Annotated") or not isinstance(annotation, ast.Subscript):
        return None
    parts = subscript_args(annotation)
    if len(parts) < 2:
        return None
    inner = parts[0]
    arg: dict[str, ast.expr] | None = None
    for meta in parts[1:]:
        if str_literal(meta) is not None:
            arg = {}
            break
        if isinstance(meta, ast.Call) and call_name(meta) == "Arg":
            arg = call_keywords(meta)
            break
    if arg is None:
        return None  # no Arg metadata: not registered automatically
    no_cli = arg.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return None
    cli_name = str_literal(arg.get("cli_name")) or "--" + name.replace("_", "-")
    names = [cli_name, *(str_literals(arg.get("aliases")) or ())]
    choices_node = arg.get("choices")
    choices = str_literals(choices_node)
    if choices is None and isinstance(choices_node, ast.Name):
        choices = lists.get(choices_node.id)
    atoms = types.atoms(inner)
    arity: Arity
    if "action" in arg:
        arity, _ = arity_from_keywords({"action": arg["action"]}, "value")
        nargs_kwargs = arg.get("action_kwargs")
        if isinstance(nargs_kwargs, ast.Dict):
            extra = {
                str_literal(k) or "": v for k, v in zip(nargs_kwargs.keys, nargs_kwargs.values, strict=True)
            }
            arity, _ = arity_from_keywords({k: v for k, v in extra.items() if k == "nargs"}, arity)
        return names, OptionSpec(arity, source, choices)
    base = inner
    if subscript_base(inner) == "Optional" and isinstance(inner, ast.Subscript):
        base = subscript_args(inner)[0]
    elif isinstance(inner, ast.BinOp):
        non_none = [
            side
            for side in (inner.left, inner.right)
            if not (isinstance(side, ast.Constant) and side.value is None)
        ]
        base = non_none[0] if len(non_none) == 1 else inner
    base_atoms = types.atoms(base)
    if base_atoms == {"Literal"}:
        return names, OptionSpec("value", source, choices or dedupe(types.literals(base)))
    if base_atoms == {"list"} and "type_parser" not in arg:
        arity, _ = arity_from_keywords({"nargs": arg["nargs"]} if "nargs" in arg else {}, "list")
        return names, OptionSpec(arity, source, None)
    if base_atoms == {"bool"} or atoms == {"bool"}:
        return names, OptionSpec("flag", source, None)
    arity, _ = arity_from_keywords({"nargs": arg["nargs"]} if "nargs" in arg else {}, "value")
    return names, OptionSpec(arity, source, choices)


def extract_sglang(wheel: Path) -> EngineFacts:
    """Read the facts of an SGLang wheel (no cache)."""
    package, version = wheel_name_version(wheel)
    with WheelSource(wheel) as src:
        types = Types()
        for path in [*src.files(SGLANG_FIELDS), SGLANG_CHOICES, SGLANG_SERVER_ARGS]:
            types.add_module(path, src.tree(path))
        lists = dict(types.lists)
        options = _sglang_field_options(src, types, lists)
        for name, spec in explicit_options(
            SGLANG_SERVER_ARGS, src.tree(SGLANG_SERVER_ARGS), types, lists
        ).items():
            options.setdefault(name, spec)
        missing = [name for name in _SGLANG_EXPECTED if name not in options]
        if missing:
            raise ExtractionError(f"{wheel.name}: options {missing} not found; the extractor needs updating")

        env: dict[str, str] = {}
        environ = src.tree(SGLANG_ENVIRON)
        for node in environ.body:
            if isinstance(node, ast.ClassDef) and node.name == "Envs":
                for item in node.body:
                    if isinstance(item, ast.Assign) and isinstance(item.value, ast.Call):
                        for target in item.targets:
                            if isinstance(target, ast.Name) and target.id.isupper():
                                env.setdefault(target.id, location(SGLANG_ENVIRON, item))
                        deprecated = str_literal(call_keywords(item.value).get("deprecated_name"))
                        if deprecated:
                            env.setdefault(deprecated, location(SGLANG_ENVIRON, item))
        if not env:
            raise ExtractionError(f"{SGLANG_ENVIRON}: no Envs class attributes")
        for path in [
            *src.files("sglang/srt/disaggregation/"),
            *src.files("sglang/srt/entrypoints/"),
            SGLANG_ENVIRON,
            "sglang/srt/utils/common.py",
        ]:
            for name, where in getenv_literals(path, src.tree(path)).items():
                env.setdefault(name, where)

        routes: dict[str, str] = {}
        for path in [SGLANG_HTTP, SGLANG_COMMON]:
            for route, where in route_paths(path, src.tree(path)).items():
                routes.setdefault(route, where)
        if "/health" not in routes:
            raise ExtractionError(f"{SGLANG_HTTP}: no /health route")
        health = tuple(
            route
            for route in (
                health_route(SGLANG_HTTP, src.tree(SGLANG_HTTP), p) for p in ("/health", "/health_generate")
            )
            if route is not None
        )
        requires = _conditional_routes(src.tree(SGLANG_HTTP), src.tree(SGLANG_COMMON), SGLANG_COMMON)
    return EngineFacts(
        package=package,
        version=version,
        wheel=wheel.name,
        options=options,
        env=env,
        routes=routes,
        health=health,
        route_requires=requires,
    )


def _conditional_routes(server: ast.Module, helpers: ast.Module, helpers_path: str) -> dict[str, str]:
    """Routes mounted only under an option: ``if <...>.enable_metrics: add_prometheus_middleware(app)``
    in the server module, where the helper mounts ``Mount("/metrics", ...)`` -> ``{"/metrics":
    "--enable-metrics"}`` (sglang/srt/entrypoints/http_server.py, sglang/srt/utils/common.py)."""
    mounted: dict[str, list[str]] = {}
    for node in helpers.body:
        if isinstance(node, ast.FunctionDef):
            routes = [
                first
                for call in ast.walk(node)
                if isinstance(call, ast.Call) and call_name(call) == "Mount" and call.args
                for first in [str_literal(call.args[0])]
                if first is not None
            ]
            if routes:
                mounted[node.name] = routes
    result: dict[str, str] = {}
    for branch in ast.walk(server):
        if not isinstance(branch, ast.If) or not isinstance(branch.test, ast.Attribute):
            continue
        option = "--" + branch.test.attr.replace("_", "-")
        for inner in branch.body:
            for call in ast.walk(inner):
                if isinstance(call, ast.Call) and call_name(call) in mounted:
                    for route in mounted[call_name(call) or ""]:
                        result.setdefault(route, option)
    return result
