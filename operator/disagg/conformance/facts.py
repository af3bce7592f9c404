"""What the released software accepts, as plain data, and its cache under ``<cache>/conformance/``.

Facts are extracted once per wheel (``disagg.conformance.engines`` for vLLM and SGLang,
``disagg.conformance.routers`` for vllm-router and sglang-router) and stored as
``<cache>/conformance/<package>-<version>.json``, keyed by the wheel's file name and size and by
:data:`EXTRACTOR_VERSION` (bumped whenever an extractor changes what it finds), so reruns read JSON
instead of parsing hundreds of source files again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from disagg.cluster.binaries import default_cache_root

EXTRACTOR_VERSION = 8

Arity = Literal["flag", "value", "optional", "list"]
"""How many values an option takes: none (store_true, BooleanOptionalAction), exactly one, zero or
one (``nargs="?"``), one or more (``nargs="+"``/``"*"``, ``action="append"`` counts as ``value``)."""


class ExtractionError(RuntimeError):
    """The wheel's source no longer has the shape an extractor expects (an upstream refactor):
    conformance must fail loudly rather than check against an empty set of facts."""


@dataclass(frozen=True)
class OptionSpec:
    arity: Arity
    source: str  # "path/in/wheel.py:LINE" where the option is declared
    choices: tuple[str, ...] | None = None  # the accepted values, when argparse enforces them

    def to_json(self) -> dict[str, Any]:
        return {"arity": self.arity, "source": self.source, "choices": self.choices}

    @staticmethod
    def from_json(data: dict[str, Any]) -> OptionSpec:
        choices = data.get("choices")
        return OptionSpec(
            arity=data["arity"],
            source=data["source"],
            choices=tuple(choices) if choices is not None else None,
        )


@dataclass(frozen=True)
class FieldSpec:
    """One field of a config dataclass (vLLM KVTransferConfig)."""

    source: str
    choices: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "choices": self.choices}

    @staticmethod
    def from_json(data: dict[str, Any]) -> FieldSpec:
        choices = data.get("choices")
        return FieldSpec(source=data["source"], choices=tuple(choices) if choices is not None else None)


@dataclass(frozen=True)
class HealthRoute:
    """What the engine's health route does, where it matters for probes."""

    path: str
    source: str
    generates: bool  # the handler runs a generation before answering
    min_seconds: float  # the handler sleeps at least this long before it can answer 200
    disabled_by_env: str | None = None  # an env var that, set false, makes it answer at once

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "source": self.source,
            "generates": self.generates,
            "min_seconds": self.min_seconds,
            "disabled_by_env": self.disabled_by_env,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> HealthRoute:
        return HealthRoute(
            path=data["path"],
            source=data["source"],
            generates=bool(data["generates"]),
            min_seconds=float(data["min_seconds"]),
            disabled_by_env=data.get("disabled_by_env"),
        )


@dataclass(frozen=True)
class EngineFacts:
    """What one engine release accepts on its command line, reads from the environment and serves."""

    package: str
    version: str
    wheel: str
    options: dict[str, OptionSpec]
    env: dict[str, str]  # env var name -> where it is read
    routes: dict[str, str]  # HTTP path -> where it is registered
    kv_transfer_fields: dict[str, FieldSpec] = field(default_factory=dict)  # vLLM only
    kv_connectors: dict[str, str] = field(default_factory=dict)  # vLLM only: registered names
    # vLLM only: connector -> the kv_connector_extra_config keys its code reads (absent: not known)
    kv_extra_config_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    health: tuple[HealthRoute, ...] = ()
    route_requires: dict[str, str] = field(default_factory=dict)  # route -> the option that mounts it

    def to_json(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "version": self.version,
            "wheel": self.wheel,
            "options": {name: spec.to_json() for name, spec in sorted(self.options.items())},
            "env": dict(sorted(self.env.items())),
            "routes": dict(sorted(self.routes.items())),
            "kv_transfer_fields": {n: s.to_json() for n, s in sorted(self.kv_transfer_fields.items())},
            "kv_connectors": dict(sorted(self.kv_connectors.items())),
            "kv_extra_config_keys": {n: list(k) for n, k in sorted(self.kv_extra_config_keys.items())},
            "health": [route.to_json() for route in self.health],
            "route_requires": dict(sorted(self.route_requires.items())),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> EngineFacts:
        return EngineFacts(
            package=data["package"],
            version=data["version"],
            wheel=data["wheel"],
            options={name: OptionSpec.from_json(spec) for name, spec in data["options"].items()},
            env=dict(data["env"]),
            routes=dict(data["routes"]),
            kv_transfer_fields={
                name: FieldSpec.from_json(spec) for name, spec in data["kv_transfer_fields"].items()
            },
            kv_connectors=dict(data["kv_connectors"]),
            kv_extra_config_keys={n: tuple(k) for n, k in data.get("kv_extra_config_keys", {}).items()},
            health=tuple(HealthRoute.from_json(route) for route in data["health"]),
            route_requires=dict(data.get("route_requires", {})),
        )


@dataclass(frozen=True)
class RouterFacts:
    """What one router release reads and serves (its argv is checked by its own parser, see routers.py)."""

    package: str
    version: str
    wheel: str
    bootstrap_port_annotation: str
    annotation_source: str
    routes: tuple[str, ...]  # runs of path characters in the Rust extension (see routers.py)
    health_check_endpoint: str  # the path the router probes on its workers (RouterArgs default)

    def to_json(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "version": self.version,
            "wheel": self.wheel,
            "bootstrap_port_annotation": self.bootstrap_port_annotation,
            "annotation_source": self.annotation_source,
            "routes": list(self.routes),
            "health_check_endpoint": self.health_check_endpoint,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> RouterFacts:
        return RouterFacts(
            package=data["package"],
            version=data["version"],
            wheel=data["wheel"],
            bootstrap_port_annotation=data["bootstrap_port_annotation"],
            annotation_source=data["annotation_source"],
            routes=tuple(data["routes"]),
            health_check_endpoint=data["health_check_endpoint"],
        )


def cache_dir() -> Path:
    return default_cache_root() / "conformance"


def cached(package: str, version: str, wheel: Path, extract: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The facts of ``package==version`` from the cache, or ``extract()`` stored there first."""
    path = cache_dir() / f"{package}-{version}.json"
    key = {"wheel": wheel.name, "size": wheel.stat().st_size, "extractor": EXTRACTOR_VERSION}
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            stored = None
        if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("facts"), dict):
            facts: dict[str, Any] = stored["facts"]
            return facts
    facts = extract()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written atomically: concurrent test workers never read half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        json.dump({"key": key, "facts": facts}, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return facts
