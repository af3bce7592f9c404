"""The layout's import boundaries, enforced on the source.

The pure parts (api, render, policy, and twin except twin/live and twin/cli.py) must never import
kopf, the Kubernetes client, HTTP clients, the Prometheus client or socket-level network modules,
neither directly nor through another disagg module they import. The check walks the AST of every
module (imports inside functions included; imports guarded by ``if TYPE_CHECKING:`` excluded, since
they never run) and follows imports within disagg transitively.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "operator"
PURE_PACKAGES = ("disagg.api", "disagg.render", "disagg.policy", "disagg.twin")
EXEMPT_MODULES = ("disagg.twin.live", "disagg.twin.cli")
FORBIDDEN = (
    "kopf",
    "kubernetes",
    "httpx",
    "aiohttp",
    "prometheus_api_client",
    "requests",
    "urllib3",
    "socket",
    "ssl",
    "socketserver",
    "http.client",
    "http.server",
    "urllib.request",
    "websockets",
    "grpc",
)


@dataclass(frozen=True)
class Violation:
    start: str  # the pure module the chain starts from
    chain: tuple[str, ...]  # disagg modules from start to the importer
    forbidden: str

    def __str__(self) -> str:
        return f"{' -> '.join(self.chain)} imports {self.forbidden} (pure module {self.start})"


def module_path(root: Path, module: str) -> Path | None:
    """The file of a module under root, or None when it is not a source module there."""
    base = root.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (their else branch still runs)."""
    nodes: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and _is_type_checking_guard(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def imported_names(root: Path, path: Path) -> set[str]:
    """Absolute names of everything a module imports at run time (``from a import b`` gives a and a.b)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    this = module_name(root, path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    names: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _parents(name: str) -> list[str]:
    """a.b.c -> [a, a.b, a.b.c]: importing a submodule runs every package __init__ above it."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _forbidden_match(name: str, forbidden: tuple[str, ...]) -> str | None:
    for bad in forbidden:
        if name == bad or name.startswith(bad + "."):
            return bad
    return None


def find_violations(root: Path, starts: list[str], forbidden: tuple[str, ...] = FORBIDDEN) -> list[Violation]:
    """Follow disagg-internal imports from each start module; report every forbidden import reached."""
    top = starts[0].split(".")[0] if starts else "disagg"
    violations: list[Violation] = []
    for start in starts:
        seen: set[str] = set()
        queue: list[tuple[str, tuple[str, ...]]] = [(start, (start,))]
        while queue:
            current, chain = queue.pop(0)
            if current in seen:
                continue
            seen.add(current)
            path = module_path(root, current)
            if path is None:
                continue
            for name in sorted(imported_names(root, path)):
                bad = _forbidden_match(name, forbidden)
                if bad is not None:
                    violations.append(Violation(start, chain, bad))
                    continue
                if name.split(".")[0] != top:
                    continue
                for parent in _parents(name):
                    if parent not in seen and module_path(root, parent) is not None:
                        queue.append((parent, (*chain, parent)))
    return violations


def pure_modules(root: Path) -> list[str]:
    modules: list[str] = []
    for package in PURE_PACKAGES:
        directory = root.joinpath(*package.split("."))
        for path in sorted(directory.rglob("*.py")):
            name = module_name(root, path)
            if any(name == ex or name.startswith(ex + ".") for ex in EXEMPT_MODULES):
                continue
            modules.append(name)
    return modules


def test_pure_packages_never_import_io_libraries() -> None:
    starts = pure_modules(PACKAGE_ROOT)
    assert "disagg.policy.types" in starts  # the walk sees the tree (guards against a wrong root)
    violations = find_violations(PACKAGE_ROOT, starts)
    assert not violations, "\n".join(sorted({str(v) for v in violations}))


def _write(root: Path, module: str, source: str, package: bool = False) -> None:
    base = root.joinpath(*module.split("."))
    path = base / "__init__.py" if package else base.with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def test_checker_follows_imports_transitively(tmp_path: Path) -> None:
    _write(tmp_path, "disagg", "", package=True)
    _write(tmp_path, "disagg.policy", "", package=True)
    _write(tmp_path, "disagg.policy.engine", "from . import helpers\n")
    _write(tmp_path, "disagg.policy.helpers", "from ..k8s.client import patch\n")
    _write(tmp_path, "disagg.k8s", "", package=True)
    _write(tmp_path, "disagg.k8s.client", "def patch():\n    import kubernetes.client\n")
    violations = find_violations(tmp_path, ["disagg.policy.engine"])
    assert [(v.chain, v.forbidden) for v in violations] == [
        (("disagg.policy.engine", "disagg.policy.helpers", "disagg.k8s.client"), "kubernetes")
    ]


def test_checker_ignores_type_checking_imports_and_flags_package_inits(tmp_path: Path) -> None:
    _write(tmp_path, "disagg", "", package=True)
    _write(tmp_path, "disagg.render", "", package=True)
    _write(
        tmp_path,
        "disagg.render.build",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kopf\n"
        "from disagg.twin.sim import x\n",
    )
    _write(tmp_path, "disagg.twin", "import socket\n", package=True)
    _write(tmp_path, "disagg.twin.sim", "x = 1\n")
    violations = find_violations(tmp_path, ["disagg.render.build"])
    assert {(v.chain[-1], v.forbidden) for v in violations} == {("disagg.twin", "socket")}


def test_checker_accepts_clean_modules(tmp_path: Path) -> None:
    _write(tmp_path, "disagg", "", package=True)
    _write(tmp_path, "disagg.api", "import json\nfrom http import HTTPStatus\n", package=True)
    assert find_violations(tmp_path, ["disagg.api"]) == []
