"""``disagg crds [--out DIR|-] [--docs FILE] [--check]``: write what the models generate, or check it.

That is the CRDs, and the support-matrix table of docs/deployment.md (from disagg.api.support).
``--out -`` prints the CRDs to stdout as multi-document YAML (``disagg crds --out - | kubectl apply -f -``)
and writes nothing, the page included.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from disagg.api.crd import rendered_files
from disagg.api.support import with_support_matrix
from disagg.clicommon import EXIT_FAILURE, EXIT_OK, is_stdout, usage_error


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("crds"),
        help="directory of the CRD files (crds); - prints them to stdout",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        default=Path("docs/deployment.md"),
        help="the page whose support matrix is generated (docs/deployment.md; skipped when absent)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming every file that is missing or differs from the models",
    )
    parser.set_defaults(func=run)


def stale_files(out: Path) -> list[Path]:
    """CRD files under ``out`` that are missing or differ from what the models generate."""
    return [
        out / name
        for name, content in rendered_files().items()
        if not (out / name).is_file() or (out / name).read_text() != content
    ]


def docs_stale(docs: Path) -> bool:
    """Whether ``docs`` exists and its support-matrix table differs from the one the models generate."""
    if not docs.is_file():
        return False
    text = docs.read_text()
    return with_support_matrix(text) != text


def write_files(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in rendered_files().items():
        path = out / name
        if not path.is_file() or path.read_text() != content:
            path.write_text(content)
            written.append(path)
    return written


def crds_yaml() -> str:
    """Every CRD the models generate, as one multi-document YAML stream (file order)."""
    return "".join(
        ("" if content.startswith("---") else "---\n") + content for content in rendered_files().values()
    )


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    docs: Path = args.docs
    if is_stdout(docs):
        usage_error("disagg crds", "--docs -: the page's support matrix is rewritten in place; name the page")
    if is_stdout(out):
        if args.check:
            usage_error("disagg crds", "--check compares files on disk; --out - names none")
        sys.stdout.write(crds_yaml())
        return EXIT_OK
    if args.check:
        stale = stale_files(out) + ([docs] if docs_stale(docs) else [])
        for path in stale:
            print(f"stale: {path} (run `disagg crds --out {out} --docs {docs}`)", file=sys.stderr)
        return EXIT_FAILURE if stale else EXIT_OK
    for path in write_files(out):
        print(f"wrote {path}")
    if docs_stale(docs):
        docs.write_text(with_support_matrix(docs.read_text()))
        print(f"wrote {docs}")
    return EXIT_OK
