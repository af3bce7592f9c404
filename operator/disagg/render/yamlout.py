"""Manifests as YAML for people: no anchors, multi-line strings as literal blocks, keys in our order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class ManifestDumper(yaml.SafeDumper):
    """SafeDumper that never emits anchors/aliases and writes multi-line strings as ``|`` blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


ManifestDumper.add_representer(str, _str_representer)


def dump_manifests(objects: Iterable[dict[str, Any]]) -> str:
    """Multi-document YAML of ``objects``."""
    return yaml.dump_all(list(objects), Dumper=ManifestDumper, sort_keys=False, width=100)
