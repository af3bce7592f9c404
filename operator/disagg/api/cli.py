"""``disagg crds [--out DIR] [--check]``: write the CRDs generated from the models, or check them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from disagg.api.crd import rendered_files


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("crds"), help="directory of the CRD files (crds)")
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


def write_files(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in rendered_files().items():
        path = out / name
        if not path.is_file() or path.read_text() != content:
            path.write_text(content)
            written.append(path)
    return written


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    if args.check:
        stale = stale_files(out)
        for path in stale:
            print(f"stale: {path} (run `disagg crds --out {out}`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_files(out):
        print(f"wrote {path}")
    return 0
