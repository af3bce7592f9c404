"""The `disagg` command line.

Each subcommand lives next to the code it drives and is imported only when it is invoked, so
`disagg render` never pays for kopf or the simulator. A subcommand module exposes
``configure(parser: argparse.ArgumentParser) -> None`` which adds its arguments and sets
``parser.set_defaults(func=...)``; ``func(args) -> int`` is the exit code: 0 ok, 1 failure, 2 usage
(disagg.clicommon, documented in every ``--help``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import NamedTuple

from disagg import __version__
from disagg.clicommon import EPILOG, EXIT_OK, EXIT_USAGE


class Subcommand(NamedTuple):
    module: str
    help: str
    extra: str | None = None  # the optional dependencies it needs beyond the core (the operator image's)


SUBCOMMANDS: dict[str, Subcommand] = {
    "run": Subcommand("disagg.controller.cli", "run the operator (kopf) against the current kubeconfig"),
    "crds": Subcommand("disagg.api.cli", "write the CRDs generated from the API models (or --check them)"),
    "render": Subcommand("disagg.render.cli", "print the manifests a DisaggregatedDeployment produces"),
    "cluster": Subcommand(
        "disagg.cluster.cli", "a local control plane from real components: up|down|status|env", "twin"
    ),
    "simulate": Subcommand("disagg.twin.cli_simulate", "replay a trace through the serving twin", "twin"),
    "twin": Subcommand(
        "disagg.twin.live.cli",
        "the live twin: emulated engines with vLLM/SGLang metrics and APIs; calibrate: fit it to your runs",
        "twin",
    ),
    "demo": Subcommand("disagg.demo.cli", "the closed-loop demo on the local control plane", "twin"),
    "conformance": Subcommand(
        "disagg.conformance.cli",
        "check what a DisaggregatedDeployment renders against the released engines and routers",
    ),
}


def version() -> str:
    """The installed distribution's version (package metadata); the source tree's when not installed."""
    try:
        return importlib.metadata.version("disagg")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disagg",
        description="Prefill/decode disaggregated LLM serving on Kubernetes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"disagg {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in SUBCOMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in SUBCOMMANDS:
        parser = _top_parser()
        if args_list and args_list[0] in ("-h", "--help"):
            parser.print_help()
            return EXIT_OK
        if args_list and args_list[0] == "--version":
            print(f"disagg {version()}")
            return EXIT_OK
        parser.print_usage(sys.stderr)
        if args_list:
            print(f"disagg: unknown command {args_list[0]!r}", file=sys.stderr)
        return EXIT_USAGE
    name, rest = args_list[0], args_list[1:]
    command = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(command.module)
    except ModuleNotFoundError as missing:
        if command.extra is None or missing.name is None or missing.name.partition(".")[0] == "disagg":
            raise
        print(
            f"disagg {name}: needs {missing.name}, which the core install (the operator image's) leaves out;"
            f" install the {command.extra} extra: pip install 'disagg[{command.extra}]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    parser = argparse.ArgumentParser(
        prog=f"disagg {name}",
        description=command.help,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.configure(parser)
    args = parser.parse_args(rest)  # a usage error exits 2 here
    func = getattr(args, "func", None)
    if func is None:  # a command of subcommands given none of them
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(func(args))


if __name__ == "__main__":
    raise SystemExit(main())
