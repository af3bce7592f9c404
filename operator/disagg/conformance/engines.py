"""Facts about the released engines, read from their wheels' source with ``ast`` (never installed).

A wheel is a zip archive; the argument definitions, environment variables, KV connector registry and
HTTP routes of vLLM and SGLang are plain Python source inside it, so reading them needs neither torch
nor a GPU. Every extractor mirrors how the wheel itself turns declarations into ``argparse`` options
(the functions it mirrors are named in each docstring) and raises :class:`ExtractionError` when the
source no longer has that shape, so an upstream refactor fails conformance instead of emptying it.

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
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from disagg.conformance.facts import (
    Arity,
    EngineFacts,
    ExtractionError,
    FieldSpec,
    HealthRoute,
    OptionSpec,
    cached,
)

_ROUTE_METHODS = frozenset(
    {"get", "post", "put", "delete", "patch", "head", "api_route", "websocket", "route"}
)
_ROUTE_CALLS = frozenset({"add_api_route", "add_route", "add_get", "add_post", "add_websocket_route"})
_FLAG_ACTIONS = frozenset({"store_true", "store_false", "store_const", "count", "help", "version"})
_BUILTIN_ATOMS = frozenset({"bool", "str", "int", "float", "list", "tuple", "set", "dict", "Any"})
_SEQUENCES = {"list": "list", "List": "list", "Sequence": "list", "tuple": "tuple", "Tuple": "tuple"}
_SEQUENCES |= {"set": "set", "Set": "set", "frozenset": "set"}
_MAPPINGS = frozenset({"dict", "Dict", "Mapping", "MutableMapping"})


# ------------------------------------------------------------------------------------------ the wheel


class WheelSource:
    """The Python source files of one wheel, parsed on demand (one instance per extraction)."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self._zip = zipfile.ZipFile(wheel)
        self._names = frozenset(self._zip.namelist())
        self._trees: dict[str, ast.Module] = {}

    def __enter__(self) -> WheelSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self._zip.close()

    def has(self, path: str) -> bool:
        return path in self._names

    def files(self, prefix: str, suffix: str = ".py") -> list[str]:
        return sorted(name for name in self._names if name.startswith(prefix) and name.endswith(suffix))

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            if path not in self._names:
                raise ExtractionError(f"{self.wheel.name} has no {path}")
            text = self._zip.read(path).decode("utf-8")
            try:
                self._trees[path] = ast.parse(text, filename=path)
            except SyntaxError as exc:
                raise ExtractionError(f"{self.wheel.name}: {path} does not parse: {exc}") from exc
        return self._trees[path]


def _where(path: str, node: ast.AST) -> str:
    return f"{path}:{getattr(node, 'lineno', 0)}"


def _str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _strings(node: ast.AST | None) -> tuple[str, ...] | None:
    """The values of a list/tuple/set literal of constants, as strings; None when it is not one."""
    if not isinstance(node, ast.List | ast.Tuple | ast.Set):
        return None
    values: list[str] = []
    for elt in node.elts:
        if not isinstance(elt, ast.Constant) or elt.value is None:
            return None
        values.append(str(elt.value))
    return tuple(values)


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}


# -------------------------------------------------------------------------------- type annotations


@dataclass
class _ClassInfo:
    path: str
    node: ast.ClassDef
    bases: list[str]
    fields: list[tuple[str, ast.expr, ast.AnnAssign]] = field(default_factory=list)


@dataclass
class _Types:
    """Module-level type aliases and classes of the modules read, to interpret field annotations."""

    aliases: dict[str, ast.expr] = field(default_factory=dict)
    classes: dict[str, _ClassInfo] = field(default_factory=dict)
    lists: dict[str, tuple[str, ...]] = field(default_factory=dict)  # NAME = ["a", "b"] at module level

    def add_module(self, path: str, tree: ast.Module) -> None:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    values = _strings(node.value)
                    if values is not None:
                        self.lists.setdefault(target.id, values)
                    elif isinstance(node.value, ast.Subscript | ast.BinOp):
                        self.aliases.setdefault(target.id, node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                if isinstance(node.value, ast.Subscript | ast.BinOp):
                    self.aliases.setdefault(node.target.id, node.value)
            elif isinstance(node, ast.ClassDef) and node.name not in self.classes:
                info = _ClassInfo(path, node, [_base_name(base) for base in node.bases])
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        if _subscript_base(item.annotation) == "ClassVar":
                            continue
                        info.fields.append((item.target.id, item.annotation, item))
                self.classes[node.name] = info

    def all_fields(self, name: str) -> list[tuple[str, ast.expr, ast.AnnAssign, str]]:
        """Fields of a dataclass and its bases (bases first), with the declaring file."""
        info = self.classes.get(name)
        if info is None:
            return []
        result: list[tuple[str, ast.expr, ast.AnnAssign, str]] = []
        for base in info.bases:
            result += self.all_fields(base)
        seen = {item[0] for item in result}
        for field_name, annotation, node in info.fields:
            if field_name in seen:
                result = [item for item in result if item[0] != field_name]
            result.append((field_name, annotation, node, info.path))
        return result

    def field_annotation(self, cls: str, name: str) -> tuple[ast.expr, str] | None:
        for field_name, annotation, node, path in self.all_fields(cls):
            if field_name == name:
                return annotation, _where(path, node)
        return None

    def atoms(self, node: ast.AST, depth: int = 0) -> set[str]:
        """The members of a type annotation's union: builtin names, "None", "Literal", "dataclass"."""
        if depth > 20:
            return {"other"}
        if isinstance(node, ast.Constant):
            if node.value is None:
                return {"None"}
            if isinstance(node.value, str):  # a forward reference
                try:
                    return self.atoms(ast.parse(node.value, mode="eval").body, depth + 1)
                except SyntaxError:
                    return {"other"}
            return {"other"}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.atoms(node.left, depth + 1) | self.atoms(node.right, depth + 1)
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.atoms(self.aliases[node.id], depth + 1)
            if node.id in _BUILTIN_ATOMS:
                return {node.id}
            if node.id in _SEQUENCES:
                return {_SEQUENCES[node.id]}
            if node.id in _MAPPINGS:
                return {"dict"}
            if node.id in self.classes:
                return {"dataclass"}
            return {"other"}
        if isinstance(node, ast.Subscript):
            base = _subscript_base(node)
            args = _subscript_args(node)
            if base == "Optional":
                return self.atoms(args[0], depth + 1) | {"None"} if args else {"None"}
            if base == "Union":
                return set().union(*(self.atoms(arg, depth + 1) for arg in args)) if args else {"other"}
            if base == "Literal":
                return {"Literal"}
            if base == "Annotated":
                return self.atoms(args[0], depth + 1) if args else {"other"}
            if base in _SEQUENCES:
                return {_SEQUENCES[base]}
            if base in _MAPPINGS:
                return {"dict"}
            return {"other"}
        return {"other"}

    def literals(self, node: ast.AST, depth: int = 0) -> list[str]:
        """The values of every ``Literal[...]`` in an annotation, aliases followed."""
        if depth > 20:
            return []
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return self.literals(self.aliases[node.id], depth + 1)
        if isinstance(node, ast.BinOp):
            return self.literals(node.left, depth + 1) + self.literals(node.right, depth + 1)
        if isinstance(node, ast.Subscript):
            base = _subscript_base(node)
            values: list[str] = []
            for arg in _subscript_args(node):
                if base == "Literal" and isinstance(arg, ast.Constant) and arg.value is not None:
                    values.append(str(arg.value))
                else:
                    values += self.literals(arg, depth + 1)
            return values
        return []


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _subscript_base(node: ast.AST) -> str:
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return ""


def _subscript_args(node: ast.Subscript) -> list[ast.expr]:
    if isinstance(node.slice, ast.Tuple):
        return list(node.slice.elts)
    return [node.slice]


def _dedupe(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


# ------------------------------------------------------------------------------------ argparse calls


def _vllm_field_spec(types: _Types, annotation: ast.expr, source: str) -> tuple[OptionSpec, bool]:
    """The option vLLM's ``_compute_kwargs`` (vllm/engine/arg_utils.py) makes of a config field, and
    whether it is a ``BooleanOptionalAction`` (which adds ``--no-<name>``)."""
    atoms = types.atoms(annotation)
    if "dataclass" in atoms:
        return OptionSpec("value", source), False
    if atoms == {"bool", "str", "None"}:
        return OptionSpec("optional", source), False
    if "bool" in atoms:
        return OptionSpec("flag", source), True
    if "Literal" in atoms:
        values = types.literals(annotation)
        choices = _dedupe(values) if values and "str" not in atoms else None
        return OptionSpec("value", source, choices), False
    if atoms & {"list", "tuple", "set"}:
        return OptionSpec("list", source), False
    return OptionSpec("value", source), False


def _arity_from_keywords(kwargs: dict[str, ast.expr], base: Arity) -> tuple[Arity, bool]:
    """Arity of an ``add_argument`` call from its explicit ``action``/``nargs`` keywords."""
    arity, negatable = base, False
    action = kwargs.get("action")
    if action is not None:
        name = _str(action) or _base_name(action)  # "store_true", or BooleanOptionalAction, MyAction
        if name in _FLAG_ACTIONS or any(word in name for word in ("StoreTrue", "StoreFalse", "StoreConst")):
            arity = "flag"
        elif name == "BooleanOptionalAction":
            arity, negatable = "flag", True
        elif name in ("append", "extend"):
            arity = "value"
        elif name:
            arity = "value"  # a custom Action: one value unless nargs says otherwise
    nargs = kwargs.get("nargs")
    if isinstance(nargs, ast.Constant):
        if nargs.value == "?":
            arity = "optional"
        elif nargs.value in ("*", "+"):
            arity = "list"
        elif nargs.value == 0:
            arity = "flag"
        elif isinstance(nargs.value, int):
            arity = "value" if nargs.value == 1 else "list"
    elif isinstance(nargs, ast.Attribute) and nargs.attr == "REMAINDER":
        arity = "list"
    return arity, negatable


def _add_option(
    options: dict[str, OptionSpec], names: Iterable[str], spec: OptionSpec, negatable: bool
) -> None:
    for name in names:
        options.setdefault(name, spec)
        if negatable and name.startswith("--"):
            options.setdefault("--no-" + name[2:], OptionSpec("flag", spec.source))


def _explicit_options(
    path: str, tree: ast.Module, types: _Types, lists: dict[str, tuple[str, ...]] | None = None
) -> dict[str, OptionSpec]:
    """Every ``*.add_argument("--opt", ...)`` with literal option strings in one module.

    ``**kwargs["field"]`` where ``kwargs = get_kwargs(ConfigClass)`` (vLLM) takes its arity and
    choices from the field's annotation, as ``_compute_kwargs`` does.
    """
    options: dict[str, OptionSpec] = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        kwarg_classes: dict[str, str] = {}
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)
                and _call_name(node.value) == "get_kwargs"
                and node.value.args
                and isinstance(node.value.args[0], ast.Name)
            ):
                kwarg_classes[node.targets[0].id] = node.value.args[0].id
        for node in ast.walk(function):
            if not isinstance(node, ast.Call) or _call_name(node) != "add_argument":
                continue
            names = [s for s in (_str(arg) for arg in node.args) if s is not None and s.startswith("-")]
            if not names:
                continue
            source = _where(path, node)
            base = OptionSpec("value", source)
            base_negatable = False
            kwargs = _keywords(node)
            # ``**kw["field"]`` or ``**{**kw["field"], "default": None}``
            spreads: list[ast.expr] = []
            for kw in node.keywords:
                if kw.arg is None and isinstance(kw.value, ast.Dict):
                    for key, value in zip(kw.value.keys, kw.value.values, strict=True):
                        if key is None:
                            spreads.append(value)
                        elif _str(key) is not None:
                            kwargs.setdefault(_str(key) or "", value)
                elif kw.arg is None:
                    spreads.append(kw.value)
            for value in spreads:
                if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
                    if value.value.id not in kwarg_classes:
                        continue
                    field_name = _str(value.slice)
                    found = types.field_annotation(kwarg_classes[value.value.id], field_name or "")
                    if found is None:
                        raise ExtractionError(
                            f"{source}: {kwarg_classes[value.value.id]}.{field_name} not found in the "
                            "config classes read"
                        )
                    base, base_negatable = _vllm_field_spec(types, found[0], source)
            arity, negatable = _arity_from_keywords(kwargs, base.arity)
            choices = base.choices
            if "choices" in kwargs:
                choices = _strings(kwargs["choices"])
                if choices is None and lists is not None and isinstance(kwargs["choices"], ast.Name):
                    choices = lists.get(kwargs["choices"].id)
            _add_option(options, names, OptionSpec(arity, source, choices), negatable or base_negatable)
    return options


# --------------------------------------------------------------------------------------- HTTP routes


def _routes(path: str, tree: ast.Module) -> dict[str, str]:
    """Literal paths of route decorators and route registration calls in one module."""
    routes: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = _call_name(node)
        first = _str(node.args[0])
        if first is None or not first.startswith("/"):
            continue
        is_method = isinstance(node.func, ast.Attribute) and name in _ROUTE_METHODS
        if is_method or name in _ROUTE_CALLS or name in ("Mount", "Route", "APIRoute"):
            routes.setdefault(first, _where(path, node))
    return routes


def _decorated(tree: ast.Module, path_literal: str) -> Iterator[ast.AsyncFunctionDef | ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and decorator.args
                    and _str(decorator.args[0]) == path_literal
                ):
                    yield node


def _health(path: str, tree: ast.Module, route: str) -> HealthRoute | None:
    """What the handler of ``route`` does: whether it generates, how long it sleeps at least, and
    which ``envs.X`` switch (negated in a test comparing the path to ``route``) bypasses it."""
    for function in _decorated(tree, route):
        generates = any(
            isinstance(node, ast.Call) and _call_name(node) in ("generate_request", "generate")
            for node in ast.walk(function)
        )
        min_seconds = 0.0
        for node in ast.walk(function):
            if isinstance(node, ast.While):
                for inner in ast.walk(node):
                    if (
                        isinstance(inner, ast.Call)
                        and _call_name(inner) == "sleep"
                        and inner.args
                        and isinstance(inner.args[0], ast.Constant)
                        and isinstance(inner.args[0].value, int | float)
                    ):
                        min_seconds = max(min_seconds, float(inner.args[0].value))
                break
        switch = None
        for node in ast.walk(function):
            if not isinstance(node, ast.If) or not any(
                isinstance(inner, ast.Compare) and any(_str(c) == route for c in inner.comparators)
                for inner in ast.walk(node.test)
            ):
                continue
            for inner in ast.walk(node.test):
                if isinstance(inner, ast.UnaryOp) and isinstance(inner.op, ast.Not):
                    for attr in ast.walk(inner.operand):
                        if (
                            isinstance(attr, ast.Attribute)
                            and isinstance(attr.value, ast.Name)
                            and attr.value.id == "envs"
                        ):
                            switch = attr.attr
        return HealthRoute(route, _where(path, function), generates, min_seconds, switch)
    return None


# ------------------------------------------------------------------------------- environment reads


def _getenv_literals(path: str, tree: ast.Module) -> dict[str, str]:
    """``os.getenv("X")``, ``os.environ.get("X")``, ``os.environ["X"]`` and ``"X" in os.environ``."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        name: str | None = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("getenv", "get", "pop", "setdefault"):
                owner = func.value
                is_os = isinstance(owner, ast.Name) and owner.id == "os" and func.attr == "getenv"
                is_environ = isinstance(owner, ast.Attribute) and owner.attr == "environ"
                if is_os or is_environ:
                    name = _str(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "environ":
                name = _str(node.slice)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In):
            target = node.comparators[0]
            if isinstance(target, ast.Attribute) and target.attr == "environ":
                name = _str(node.left)
        if name:
            found.setdefault(name, _where(path, node))
    return found


# --------------------------------------------------------------------------------------------- vLLM

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


def _frontend_options(src: WheelSource, types: _Types) -> dict[str, OptionSpec]:
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
            spec, negatable = _vllm_field_spec(types, annotation, _where(path, node))
            custom = customised.get(field_name, _Customised())
            spec = OptionSpec(custom.arity or spec.arity, spec.source, spec.choices)
            _add_option(options, ["--" + field_name.replace("_", "-"), *custom.flags], spec, negatable)
    if not options:
        raise ExtractionError(f"{VLLM_FRONTEND}: make_arg_parser adds no generated frontend options")
    return options


def _mro(types: _Types, cls: str) -> list[str]:
    info = types.classes.get(cls)
    if info is None:
        return []
    result = [cls]
    for base in info.bases:
        result += _mro(types, base)
    return result


def _field_generator(types: _Types) -> set[str]:
    """Classes whose ``add_cli_args`` calls ``get_kwargs(cls)`` and ``add_argument(... f"--{key.replace('_',
    '-')}" ...)`` (``BaseFrontendArgs.add_cli_args`` in vllm/entrypoints/common/cli_args.py)."""
    result: set[str] = set()
    for name, info in types.classes.items():
        for item in info.node.body:
            if not isinstance(item, ast.FunctionDef) or item.name != "add_cli_args":
                continue
            uses_kwargs = any(
                isinstance(n, ast.Call) and _call_name(n) == "get_kwargs" for n in ast.walk(item)
            )
            kebab = any(
                isinstance(n, ast.JoinedStr)
                and any(_str(v) == "--" for v in n.values)
                and any(
                    isinstance(c, ast.Call)
                    and _call_name(c) == "replace"
                    and [_str(a) for a in c.args] == ["_", "-"]
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
            outer, inner = _str(node.slice), _str(node.value.slice)
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
                entry.flags = _strings(value) or ()
            elif (key == "nargs" and value is None) or (key == "action" and _str(value) == "append"):
                entry.arity = "value"
    return result


def extract_vllm(wheel: Path) -> EngineFacts:
    """Read the facts of a vLLM wheel (no cache)."""
    package, version = _name_version(wheel)
    with WheelSource(wheel) as src:
        types = _Types()
        for path in src.files("vllm/config/"):
            types.add_module(path, src.tree(path))
        types.add_module(VLLM_FRONTEND, src.tree(VLLM_FRONTEND))
        options: dict[str, OptionSpec] = {}
        for path in (VLLM_SERVE, VLLM_FRONTEND, VLLM_ENGINE_ARGS):
            for name, spec in _explicit_options(path, src.tree(path), types).items():
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
            for route, where in _routes(path, src.tree(path)).items():
                routes.setdefault(route, where)
        if "/health" not in routes:
            raise ExtractionError(f"{wheel.name}: no /health route found under vllm/entrypoints/")
        health = _health(
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
                name = _str(key)
                if name:
                    env[name] = _where(VLLM_ENVS, key)  # type: ignore[arg-type]
    if not env:
        raise ExtractionError(f"{VLLM_ENVS}: no environment_variables dict found")
    for path in [VLLM_ENVS, *src.files("vllm/distributed/kv_transfer/")]:
        for name, where in _getenv_literals(path, src.tree(path)).items():
            env.setdefault(name, where)
    return env


def _kv_transfer_fields(src: WheelSource, types: _Types) -> dict[str, FieldSpec]:
    info = types.classes.get("KVTransferConfig")
    if info is None or info.path != VLLM_KV_TRANSFER:
        raise ExtractionError(f"{VLLM_KV_TRANSFER}: no KVTransferConfig class")
    result: dict[str, FieldSpec] = {}
    for name, annotation, node, path in types.all_fields("KVTransferConfig"):
        atoms = types.atoms(annotation)
        values = types.literals(annotation) if "Literal" in atoms and "str" not in atoms else []
        result[name] = FieldSpec(_where(path, node), _dedupe(values) if values else None)
    return result


def _registered_connectors(src: WheelSource) -> dict[str, tuple[str, str]]:
    """Connector name -> (where it is registered, its module) from ``register_connector(name, module,
    class)`` calls."""
    connectors: dict[str, tuple[str, str]] = {}
    for node in ast.walk(src.tree(VLLM_KV_FACTORY)):
        if isinstance(node, ast.Call) and _call_name(node) == "register_connector" and len(node.args) >= 2:
            name, module = _str(node.args[0]), _str(node.args[1])
            if name and module:
                connectors[name] = (_where(VLLM_KV_FACTORY, node), module)
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
                        key = _str(node.args[0])
                        if key is None:
                            return None
                        keys.append(key)
                    elif attr in ("items", "keys", "values", "update", "copy") and is_extra(owner):
                        return None
                elif isinstance(node, ast.Subscript) and is_extra(node.value):
                    key = _str(node.slice)
                    if key is None:
                        return None
                    keys.append(key)
                elif isinstance(node, ast.keyword) and node.arg is None and is_extra(node.value):
                    return None
    return _dedupe(sorted(keys)) if keys else None


# ------------------------------------------------------------------------------------------- SGLang

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
    src: WheelSource, types: _Types, lists: dict[str, tuple[str, ...]]
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
            spec = _sglang_field(types, lists, field_name, annotation, _where(info.path, node))
            if spec is not None:
                names, option = spec
                _add_option(options, names, option, False)
    return options


def _sglang_field(
    types: _Types, lists: dict[str, tuple[str, ...]], name: str, annotation: ast.expr, source: str
) -> tuple[list[str], OptionSpec] | None:
    if _subscript_base(annotation) not in ("A", "Annotated") or not isinstance(annotation, ast.Subscript):
        return None
    parts = _subscript_args(annotation)
    if len(parts) < 2:
        return None
    inner = parts[0]
    arg: dict[str, ast.expr] | None = None
    for meta in parts[1:]:
        if _str(meta) is not None:
            arg = {}
            break
        if isinstance(meta, ast.Call) and _call_name(meta) == "Arg":
            arg = _keywords(meta)
            break
    if arg is None:
        return None  # no Arg metadata: not registered automatically
    no_cli = arg.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return None
    cli_name = _str(arg.get("cli_name")) or "--" + name.replace("_", "-")
    names = [cli_name, *(_strings(arg.get("aliases")) or ())]
    choices_node = arg.get("choices")
    choices = _strings(choices_node)
    if choices is None and isinstance(choices_node, ast.Name):
        choices = lists.get(choices_node.id)
    atoms = types.atoms(inner)
    arity: Arity
    if "action" in arg:
        arity, _ = _arity_from_keywords({"action": arg["action"]}, "value")
        nargs_kwargs = arg.get("action_kwargs")
        if isinstance(nargs_kwargs, ast.Dict):
            extra = {_str(k) or "": v for k, v in zip(nargs_kwargs.keys, nargs_kwargs.values, strict=True)}
            arity, _ = _arity_from_keywords({k: v for k, v in extra.items() if k == "nargs"}, arity)
        return names, OptionSpec(arity, source, choices)
    base = inner
    if _subscript_base(inner) == "Optional" and isinstance(inner, ast.Subscript):
        base = _subscript_args(inner)[0]
    elif isinstance(inner, ast.BinOp):
        non_none = [
            side
            for side in (inner.left, inner.right)
            if not (isinstance(side, ast.Constant) and side.value is None)
        ]
        base = non_none[0] if len(non_none) == 1 else inner
    base_atoms = types.atoms(base)
    if base_atoms == {"Literal"}:
        return names, OptionSpec("value", source, choices or _dedupe(types.literals(base)))
    if base_atoms == {"list"} and "type_parser" not in arg:
        arity, _ = _arity_from_keywords({"nargs": arg["nargs"]} if "nargs" in arg else {}, "list")
        return names, OptionSpec(arity, source, None)
    if base_atoms == {"bool"} or atoms == {"bool"}:
        return names, OptionSpec("flag", source, None)
    arity, _ = _arity_from_keywords({"nargs": arg["nargs"]} if "nargs" in arg else {}, "value")
    return names, OptionSpec(arity, source, choices)


def extract_sglang(wheel: Path) -> EngineFacts:
    """Read the facts of an SGLang wheel (no cache)."""
    package, version = _name_version(wheel)
    with WheelSource(wheel) as src:
        types = _Types()
        for path in [*src.files(SGLANG_FIELDS), SGLANG_CHOICES, SGLANG_SERVER_ARGS]:
            types.add_module(path, src.tree(path))
        lists = dict(types.lists)
        options = _sglang_field_options(src, types, lists)
        for name, spec in _explicit_options(
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
                                env.setdefault(target.id, _where(SGLANG_ENVIRON, item))
                        deprecated = _str(_keywords(item.value).get("deprecated_name"))
                        if deprecated:
                            env.setdefault(deprecated, _where(SGLANG_ENVIRON, item))
        if not env:
            raise ExtractionError(f"{SGLANG_ENVIRON}: no Envs class attributes")
        for path in [
            *src.files("sglang/srt/disaggregation/"),
            *src.files("sglang/srt/entrypoints/"),
            SGLANG_ENVIRON,
            "sglang/srt/utils/common.py",
        ]:
            for name, where in _getenv_literals(path, src.tree(path)).items():
                env.setdefault(name, where)

        routes: dict[str, str] = {}
        for path in [SGLANG_HTTP, SGLANG_COMMON]:
            for route, where in _routes(path, src.tree(path)).items():
                routes.setdefault(route, where)
        if "/health" not in routes:
            raise ExtractionError(f"{SGLANG_HTTP}: no /health route")
        health = tuple(
            route
            for route in (
                _health(SGLANG_HTTP, src.tree(SGLANG_HTTP), p) for p in ("/health", "/health_generate")
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
                if isinstance(call, ast.Call) and _call_name(call) == "Mount" and call.args
                for first in [_str(call.args[0])]
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
                if isinstance(call, ast.Call) and _call_name(call) in mounted:
                    for route in mounted[_call_name(call) or ""]:
                        result.setdefault(route, option)
    return result


# -------------------------------------------------------------------------------------------- entry


def _name_version(wheel: Path) -> tuple[str, str]:
    parts = wheel.name.split("-")
    if len(parts) < 3:
        raise ExtractionError(f"{wheel.name} is not a wheel file name")
    return parts[0].replace("_", "-").lower(), parts[1]


def engine_facts(package: str, version: str) -> EngineFacts:
    """The facts of ``package==version`` (``vllm`` or ``sglang``), the wheel downloaded when missing,
    extracted once and cached under ``<cache>/conformance/``."""
    extractors = {"vllm": extract_vllm, "sglang": extract_sglang}
    if package not in extractors:
        raise ValueError(f"no engine extractor for {package!r}")
    from disagg.cluster.released import ensure_wheel  # imports disagg.render.settings: not at import time

    wheel = ensure_wheel(package, version)
    data = cached(package, version, wheel, lambda: extractors[package](wheel).to_json())
    return EngineFacts.from_json(data)
