"""Reading a released engine's declarations out of its wheel with ``ast`` (never installed): the zip
archive (:class:`WheelSource`), type annotations (:class:`Types`), ``argparse`` calls, HTTP routes and
environment reads. What vLLM and SGLang build from them: :mod:`disagg.conformance.engines.vllm` and
:mod:`disagg.conformance.engines.sglang`.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from disagg.conformance.facts import (
    Arity,
    ExtractionError,
    HealthRoute,
    OptionSpec,
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


def location(path: str, node: ast.AST) -> str:
    return f"{path}:{getattr(node, 'lineno', 0)}"


def str_literal(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def str_literals(node: ast.AST | None) -> tuple[str, ...] | None:
    """The values of a list/tuple/set literal of constants, as strings; None when it is not one."""
    if not isinstance(node, ast.List | ast.Tuple | ast.Set):
        return None
    values: list[str] = []
    for elt in node.elts:
        if not isinstance(elt, ast.Constant) or elt.value is None:
            return None
        values.append(str(elt.value))
    return tuple(values)


def call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def call_keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}


# -------------------------------------------------------------------------------- type annotations


@dataclass
class _ClassInfo:
    path: str
    node: ast.ClassDef
    bases: list[str]
    fields: list[tuple[str, ast.expr, ast.AnnAssign]] = field(default_factory=list)


@dataclass
class Types:
    """Module-level type aliases and classes of the modules read, to interpret field annotations."""

    aliases: dict[str, ast.expr] = field(default_factory=dict)
    classes: dict[str, _ClassInfo] = field(default_factory=dict)
    lists: dict[str, tuple[str, ...]] = field(default_factory=dict)  # NAME = ["a", "b"] at module level

    def add_module(self, path: str, tree: ast.Module) -> None:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    values = str_literals(node.value)
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
                        if subscript_base(item.annotation) == "ClassVar":
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
                return annotation, location(path, node)
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
            base = subscript_base(node)
            args = subscript_args(node)
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
            base = subscript_base(node)
            values: list[str] = []
            for arg in subscript_args(node):
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


def subscript_base(node: ast.AST) -> str:
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return ""


def subscript_args(node: ast.Subscript) -> list[ast.expr]:
    if isinstance(node.slice, ast.Tuple):
        return list(node.slice.elts)
    return [node.slice]


def dedupe(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


# ------------------------------------------------------------------------------------ argparse calls


def vllm_field_spec(types: Types, annotation: ast.expr, source: str) -> tuple[OptionSpec, bool]:
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
        choices = dedupe(values) if values and "str" not in atoms else None
        return OptionSpec("value", source, choices), False
    if atoms & {"list", "tuple", "set"}:
        return OptionSpec("list", source), False
    return OptionSpec("value", source), False


def arity_from_keywords(kwargs: dict[str, ast.expr], base: Arity) -> tuple[Arity, bool]:
    """Arity of an ``add_argument`` call from its explicit ``action``/``nargs`` keywords."""
    arity, negatable = base, False
    action = kwargs.get("action")
    if action is not None:
        name = str_literal(action) or _base_name(action)  # "store_true", or BooleanOptionalAction, MyAction
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


def add_option(
    options: dict[str, OptionSpec], names: Iterable[str], spec: OptionSpec, negatable: bool
) -> None:
    for name in names:
        options.setdefault(name, spec)
        if negatable and name.startswith("--"):
            options.setdefault("--no-" + name[2:], OptionSpec("flag", spec.source))


def explicit_options(
    path: str, tree: ast.Module, types: Types, lists: dict[str, tuple[str, ...]] | None = None
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
                and call_name(node.value) == "get_kwargs"
                and node.value.args
                and isinstance(node.value.args[0], ast.Name)
            ):
                kwarg_classes[node.targets[0].id] = node.value.args[0].id
        for node in ast.walk(function):
            if not isinstance(node, ast.Call) or call_name(node) != "add_argument":
                continue
            names = [
                s for s in (str_literal(arg) for arg in node.args) if s is not None and s.startswith("-")
            ]
            if not names:
                continue
            source = location(path, node)
            base = OptionSpec("value", source)
            base_negatable = False
            kwargs = call_keywords(node)
            # ``**kw["field"]`` or ``**{**kw["field"], "default": None}``
            spreads: list[ast.expr] = []
            for kw in node.keywords:
                if kw.arg is None and isinstance(kw.value, ast.Dict):
                    for key, value in zip(kw.value.keys, kw.value.values, strict=True):
                        if key is None:
                            spreads.append(value)
                        elif str_literal(key) is not None:
                            kwargs.setdefault(str_literal(key) or "", value)
                elif kw.arg is None:
                    spreads.append(kw.value)
            for value in spreads:
                if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
                    if value.value.id not in kwarg_classes:
                        continue
                    field_name = str_literal(value.slice)
                    found = types.field_annotation(kwarg_classes[value.value.id], field_name or "")
                    if found is None:
                        raise ExtractionError(
                            f"{source}: {kwarg_classes[value.value.id]}.{field_name} not found in the "
                            "config classes read"
                        )
                    base, base_negatable = vllm_field_spec(types, found[0], source)
            arity, negatable = arity_from_keywords(kwargs, base.arity)
            choices = base.choices
            if "choices" in kwargs:
                choices = str_literals(kwargs["choices"])
                if choices is None and lists is not None and isinstance(kwargs["choices"], ast.Name):
                    choices = lists.get(kwargs["choices"].id)
            add_option(options, names, OptionSpec(arity, source, choices), negatable or base_negatable)
    return options


# --------------------------------------------------------------------------------------- HTTP routes


def route_paths(path: str, tree: ast.Module) -> dict[str, str]:
    """Literal paths of route decorators and route registration calls in one module."""
    routes: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = call_name(node)
        first = str_literal(node.args[0])
        if first is None or not first.startswith("/"):
            continue
        is_method = isinstance(node.func, ast.Attribute) and name in _ROUTE_METHODS
        if is_method or name in _ROUTE_CALLS or name in ("Mount", "Route", "APIRoute"):
            routes.setdefault(first, location(path, node))
    return routes


def _decorated(tree: ast.Module, path_literal: str) -> Iterator[ast.AsyncFunctionDef | ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and decorator.args
                    and str_literal(decorator.args[0]) == path_literal
                ):
                    yield node


def health_route(path: str, tree: ast.Module, route: str) -> HealthRoute | None:
    """What the handler of ``route`` does: whether it generates, how long it sleeps at least, and
    which ``envs.X`` switch (negated in a test comparing the path to ``route``) bypasses it."""
    for function in _decorated(tree, route):
        generates = any(
            isinstance(node, ast.Call) and call_name(node) in ("generate_request", "generate")
            for node in ast.walk(function)
        )
        min_seconds = 0.0
        for node in ast.walk(function):
            if isinstance(node, ast.While):
                for inner in ast.walk(node):
                    if (
                        isinstance(inner, ast.Call)
                        and call_name(inner) == "sleep"
                        and inner.args
                        and isinstance(inner.args[0], ast.Constant)
                        and isinstance(inner.args[0].value, int | float)
                    ):
                        min_seconds = max(min_seconds, float(inner.args[0].value))
                break
        switch = None
        for node in ast.walk(function):
            if not isinstance(node, ast.If) or not any(
                isinstance(inner, ast.Compare) and any(str_literal(c) == route for c in inner.comparators)
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
        return HealthRoute(route, location(path, function), generates, min_seconds, switch)
    return None


# ------------------------------------------------------------------------------- environment reads


def getenv_literals(path: str, tree: ast.Module) -> dict[str, str]:
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
                    name = str_literal(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "environ":
                name = str_literal(node.slice)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In):
            target = node.comparators[0]
            if isinstance(target, ast.Attribute) and target.attr == "environ":
                name = str_literal(node.left)
        if name:
            found.setdefault(name, location(path, node))
    return found


def wheel_name_version(wheel: Path) -> tuple[str, str]:
    """The package (normalised) and version a wheel's file name names."""
    parts = wheel.name.split("-")
    if len(parts) < 3:
        raise ExtractionError(f"{wheel.name} is not a wheel file name")
    return parts[0].replace("_", "-").lower(), parts[1]
