"""``disagg render -f FILE``: print the manifests a DisaggregatedDeployment produces (the user's dry run).

FILE may hold several YAML documents (each a DisaggregatedDeployment) and ``-`` reads stdin. Output is
multi-document YAML. An invalid file prints one line per problem, naming the field, and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from disagg.api.common import describe_validation_error
from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.textfile import MAX_MANIFEST_BYTES, TextFileError, decode_text, read_text
from disagg.render import effective_replicas, render_children
from disagg.render.yamlout import dump_manifests


class RenderInputError(ValueError):
    """The input is not a valid DisaggregatedDeployment; ``problems`` name the fields."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", required=True, help="a DisaggregatedDeployment YAML file, or - for stdin"
    )
    parser.add_argument(
        "-n", "--namespace", default=None, help="namespace for objects whose metadata has none (default)"
    )
    parser.set_defaults(func=run)


def yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: the problem and where (line and column from 1)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(error).split())


def load_documents(text: str, source: str) -> list[dict[str, Any]]:
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise RenderInputError(source, [f"not valid YAML: {yaml_problem(exc)}"]) from exc
    if not docs:
        raise RenderInputError(source, ["no YAML document found"])
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise RenderInputError(source, [f"document {index + 1} is not a mapping"])
    return docs


def parse_deployment(
    doc: dict[str, Any], source: str, namespace: str | None = None
) -> DisaggregatedDeployment:
    kind = doc.get("kind")
    if kind == "RatioPolicy":
        raise RenderInputError(
            source,
            [
                "kind: RatioPolicy is a policy, not a deployment: it renders no children "
                "(kubectl apply it, or pass it to disagg simulate --policy)"
            ],
        )
    if kind != "DisaggregatedDeployment":
        raise RenderInputError(source, [f"kind: expected DisaggregatedDeployment, got {kind!r}"])
    if namespace and isinstance(doc.get("metadata"), dict) and not doc["metadata"].get("namespace"):
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    if not isinstance(doc.get("metadata"), dict) or not doc["metadata"].get("name"):
        raise RenderInputError(source, ["metadata.name: required"])
    try:
        return DisaggregatedDeployment.model_validate(doc)
    except ValidationError as exc:
        raise RenderInputError(source, describe_validation_error(exc)) from exc


def render_text(text: str, source: str, namespace: str | None = None) -> str:
    """The multi-document YAML of every child of every DisaggregatedDeployment in ``text``."""
    children: list[dict[str, Any]] = []
    for doc in load_documents(text, source):
        dd = parse_deployment(doc, source, namespace)
        children += render_children(dd, effective_replicas(dd))
    return dump_manifests(children)


def _read(filename: str, stdin: TextIO) -> tuple[str, str]:
    if filename == "-":
        buffer = getattr(stdin, "buffer", None)
        if buffer is None:  # a text stream without bytes underneath (tests' StringIO)
            return stdin.read(), "<stdin>"
        return decode_text(buffer.read(MAX_MANIFEST_BYTES + 1), "<stdin>"), "<stdin>"
    return read_text(filename, MAX_MANIFEST_BYTES), filename


def run(args: argparse.Namespace) -> int:
    try:
        text, source = _read(args.filename, sys.stdin)
    except TextFileError as exc:  # unreadable, too large, not UTF-8: one line naming the file
        print(f"disagg render: {exc}", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(render_text(text, source, args.namespace))
    except RenderInputError as exc:
        print(f"disagg render: {exc.source} is not a valid DisaggregatedDeployment:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    return 0
