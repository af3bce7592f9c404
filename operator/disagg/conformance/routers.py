"""The released routers: facts from their wheels, and their real argument parsers run on our argv.

vllm-router 0.1.17 and sglang-router 0.3.2 ship a thin Python launcher around a Rust extension:

- ``<pkg>/router_args.py`` declares ``RouterArgs`` (a dataclass) and ``add_cli_args`` (argparse);
  ``<pkg>/launch_router.py`` ``parse_router_args(argv)`` builds the launcher's parser, parses and
  converts with ``RouterArgs.from_cli_args``; ``launch_router`` then calls ``_validate_router_args()``
  before starting the Rust router. :func:`parse_router_command` runs exactly those three steps with
  the venv's Python from :func:`disagg.cluster.released.ensure_venv` (sglang-router's ``router_args``
  imports its Rust extension, so it has to be installed, not read).
- ``from_cli_args`` forces ``bootstrap_port_annotation`` (the pod annotation Kubernetes discovery
  reads the prefill bootstrap port from): ``"vllm.ai/bootstrap-port"`` in vllm_router/router_args.py,
  ``"sglang.ai/bootstrap-port"`` in sglang_router/router_args.py; :func:`router_facts` reads it with
  ``ast`` from the wheel (the assignment in ``from_cli_args`` when present, else the field default).
- HTTP routes are registered in the Rust extension (axum), where string literals are stored back to
  back without separators (``/liveness/readinessindex``, ``/healthvllm.ai/bootstrap-port``), so no
  literal's end can be told from the bytes. :func:`so_route_candidates` keeps every maximal run of
  ``[a-z0-9_/{}:.-]`` that starts with ``/``, and :func:`router_serves` accepts a path when it occurs
  in one of them. This over-approximates (a prefix of a real route, ``/heal``, passes too), which is
  acceptable for probe paths: a renamed or made-up one (``/healthz``, ``/readyz``) is in neither
  router and fails.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disagg.conformance.facts import ExtractionError, RouterFacts, cached

# The console scripts and modules the router pods run (entry_points.txt of each wheel:
# vllm-router = vllm_router.launch_router:main; `python -m sglang_router.launch_router` runs main()).
ROUTER_MODULES = {"vllm-router": "vllm_router", "sglang-router": "sglang_router"}
_RUN_LIMIT_S = 120
_ROUTE_RUN = re.compile(rb"/[a-z0-9_/{}:.\-]{1,200}")

# Run inside the router's venv: the launcher's own parser, conversion and validation.
_PARSE_SCRIPT = r"""
import contextlib, importlib, io, json, sys
module_name, argv = sys.argv[1], json.loads(sys.argv[2])
result = {"ok": False, "error": "", "args": {}}
launcher = importlib.import_module(module_name)
sys.argv[0] = module_name
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        router_args = launcher.parse_router_args(argv)
except SystemExit as exc:
    lines = [line for line in err.getvalue().splitlines() if "error:" in line]
    result["error"] = "; ".join(lines) or err.getvalue().strip()[-500:] or f"exit {exc.code}"
except Exception as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"
else:
    try:
        router_args._validate_router_args()
    except Exception as exc:
        result["error"] = f"_validate_router_args: {type(exc).__name__}: {exc}"
    else:
        result["ok"] = True
    result["args"] = json.loads(json.dumps(vars(router_args), default=str))
print(json.dumps(result))
"""


@dataclass(frozen=True)
class RouterParse:
    """The outcome of the real parser on one argv."""

    ok: bool
    error: str  # argparse's message (e.g. "unrecognized arguments: --x") or the validation error
    args: dict[str, Any]  # vars(RouterArgs) after from_cli_args


def launcher_module(package: str, command: list[str]) -> tuple[str, list[str]]:
    """``(module, argv)`` of a router container command: ``["vllm-router", *argv]`` or
    ``["python3", "-m", "sglang_router.launch_router", *argv]``."""
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1] == "-m":
        return command[2], list(command[3:])
    if command and Path(command[0]).name == package:
        return f"{ROUTER_MODULES[package]}.launch_router", list(command[1:])
    raise ValueError(f"{command[:3]!r} does not run {package}")


def parse_router_command(
    package: str, version: str, argv: list[str], module: str | None = None
) -> RouterParse:
    """Parse ``argv`` with the released router's launcher (``parse_router_args`` then
    ``_validate_router_args``), in its own venv. Needs PyPI the first time (ensure_venv)."""
    from disagg.cluster.released import ensure_venv  # imports disagg.render.settings: not at import time

    bin_dir = ensure_venv(package, version)
    name = module or f"{ROUTER_MODULES[package]}.launch_router"
    proc = subprocess.run(
        [str(bin_dir / "python"), "-c", _PARSE_SCRIPT, name, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=_RUN_LIMIT_S,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise ExtractionError(f"running {package} {version}'s parser failed (exit {proc.returncode}): {tail}")
    data = json.loads(lines[-1])
    return RouterParse(ok=bool(data["ok"]), error=str(data["error"]), args=dict(data["args"]))


# ---------------------------------------------------------------------------------- wheel facts


def _forced_or_default(tree: ast.Module, field_name: str, path: str) -> tuple[str, str] | None:
    """The value ``from_cli_args`` assigns to ``args_dict[field_name]``, else the class default."""
    default: tuple[str, str] | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "RouterArgs":
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.target.id == field_name
                    and isinstance(item.value, ast.Constant)
                    and isinstance(item.value.value, str)
                ):
                    default = (item.value.value, f"{path}:{item.lineno}")
                if isinstance(item, ast.FunctionDef) and item.name == "from_cli_args":
                    for inner in ast.walk(item):
                        if (
                            isinstance(inner, ast.Assign)
                            and len(inner.targets) == 1
                            and isinstance(inner.targets[0], ast.Subscript)
                            and isinstance(inner.targets[0].slice, ast.Constant)
                            and inner.targets[0].slice.value == field_name
                            and isinstance(inner.value, ast.Constant)
                            and isinstance(inner.value.value, str)
                        ):
                            return inner.value.value, f"{path}:{inner.lineno}"
    return default


def so_route_candidates(data: bytes) -> tuple[str, ...]:
    """Runs of path characters starting with ``/`` among the bytes of a Rust extension (module doc)."""
    return tuple(sorted({match.group().decode("ascii") for match in _ROUTE_RUN.finditer(data)}))


def router_serves(facts: RouterFacts, path: str) -> bool:
    """Whether the router's extension contains ``path`` (see the module docstring for the caveat)."""
    return any(path in run for run in facts.routes)


def extract_router(package: str, wheel: Path) -> RouterFacts:
    """Read the facts of a router wheel (no cache)."""
    module = ROUTER_MODULES[package]
    path = f"{module}/router_args.py"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        if path not in names:
            raise ExtractionError(f"{wheel.name} has no {path}")
        tree = ast.parse(archive.read(path).decode("utf-8"), filename=path)
        extensions = [n for n in names if n.endswith(".so") and "_rs" in Path(n).name]
        if not extensions:
            raise ExtractionError(f"{wheel.name} has no Rust extension (*_rs*.so)")
        routes: set[str] = set()
        for name in extensions:
            routes.update(so_route_candidates(archive.read(name)))
    annotation = _forced_or_default(tree, "bootstrap_port_annotation", path)
    if annotation is None:
        raise ExtractionError(f"{path}: RouterArgs.bootstrap_port_annotation not found")
    health = _forced_or_default(tree, "health_check_endpoint", path)
    version = wheel.name.split("-")[1]
    return RouterFacts(
        package=package,
        version=version,
        wheel=wheel.name,
        bootstrap_port_annotation=annotation[0],
        annotation_source=annotation[1],
        routes=tuple(sorted(routes)),
        health_check_endpoint=health[0] if health else "/health",
    )


def router_facts(package: str, version: str) -> RouterFacts:
    """The facts of ``package==version`` (``vllm-router`` or ``sglang-router``), cached."""
    from disagg.cluster.released import ensure_wheel  # imports disagg.render.settings: not at import time

    if package not in ROUTER_MODULES:
        raise ValueError(f"no router extractor for {package!r}")
    wheel = ensure_wheel(package, version)
    data = cached(package, version, wheel, lambda: extract_router(package, wheel).to_json())
    return RouterFacts.from_json(data)
