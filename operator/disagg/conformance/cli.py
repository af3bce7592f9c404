"""``disagg conformance -f FILE``: check what ``disagg render -f FILE`` produces against the released
engines and routers at the pinned versions (downloaded from PyPI on first use, then cached).

Prints one line per mismatch (object, container, flag/env/key/path, why) and exits 1 when there is
any, 0 when there is none. ``--no-router-parser`` skips running the routers' own parsers (which needs
their virtual environments, installed on first use).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from disagg.conformance.check import Finding, ParseRouter, ReleasedFacts, check_children


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", required=True, help="a DisaggregatedDeployment YAML file, or - for stdin"
    )
    parser.add_argument(
        "--no-router-parser",
        action="store_true",
        help="do not run the released routers' argument parsers (no router venvs needed)",
    )
    parser.set_defaults(func=run)


def released_facts() -> ReleasedFacts:
    from disagg.cluster.released import pinned_releases
    from disagg.conformance.engines import engine_facts
    from disagg.conformance.routers import router_facts

    releases = pinned_releases()
    return ReleasedFacts(
        engines={name: engine_facts(name, releases[name].version) for name in ("vllm", "sglang")},
        routers={
            name: router_facts(name, releases[name].version) for name in ("vllm-router", "sglang-router")
        },
    )


def router_parser() -> ParseRouter:
    from disagg.cluster.released import pinned_releases
    from disagg.conformance.routers import RouterParse, parse_router_command

    releases = pinned_releases()

    def parse(package: str, argv: list[str]) -> RouterParse:
        return parse_router_command(package, releases[package].version, argv)

    return parse


def findings_for_text(text: str, source: str, parse_router: ParseRouter | None) -> list[Finding]:
    from disagg.render import effective_replicas, render_children
    from disagg.render.cli import load_documents, parse_deployment

    facts = released_facts()
    findings: list[Finding] = []
    for doc in load_documents(text, source):
        dd = parse_deployment(doc, source)
        children: list[dict[str, Any]] = render_children(dd, effective_replicas(dd))
        findings += check_children(children, facts, parse_router)
    return findings


def run(args: argparse.Namespace) -> int:
    from disagg.cluster.released import ReleasedSoftwareError
    from disagg.conformance.facts import ExtractionError
    from disagg.render.cli import RenderInputError

    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
    except OSError as exc:
        print(f"disagg conformance: cannot read {args.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    source = "<stdin>" if args.filename == "-" else args.filename
    try:
        findings = findings_for_text(text, source, None if args.no_router_parser else router_parser())
    except RenderInputError as exc:
        print(f"disagg conformance: {exc.source} is not a valid DisaggregatedDeployment:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    except (ReleasedSoftwareError, ExtractionError) as exc:
        print(f"disagg conformance: {exc}", file=sys.stderr)
        return 1
    for finding in findings:
        print(finding)
    if not findings:
        print(f"{source}: conforms to the released software at the pinned versions")
    return 1 if findings else 0
