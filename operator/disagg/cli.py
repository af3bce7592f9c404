"""The `disagg` command line.

Each subcommand lives next to the code it drives and is imported only when it is invoked, so
`disagg render` never pays for kopf or the simulator. A subcommand module exposes
``configure(parser: argparse.ArgumentParser) -> None`` which adds its arguments and sets
``parser.set_defaults(func=...)``; ``func(args) -> int`` is the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("disagg.controller.cli", "run the operator (kopf) against the current kubeconfig"),
    "crds": ("disagg.api.cli", "write the CRDs generated from the API models (or --check them)"),
    "render": ("disagg.render.cli", "print the manifests a DisaggregatedDeployment produces"),
    "cluster": ("disagg.cluster.cli", "a local control plane from real components: up|down|status|env"),
    "simulate": ("disagg.twin.cli_simulate", "replay a trace through the serving twin"),
    "twin": ("disagg.twin.cli", "the live twin: emulated engines with vLLM/SGLang metrics and APIs"),
    "demo": ("disagg.demo", "the closed-loop demo on the local control plane"),
    "conformance": (
        "disagg.conformance.cli",
        "check what a DisaggregatedDeployment renders against the released engines and routers",
    ),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disagg",
        description="Prefill/decode disaggregated LLM serving on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in SUBCOMMANDS:
        parser = _top_parser()
        if args_list and args_list[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        parser.print_usage(sys.stderr)
        if args_list:
            print(f"disagg: unknown command {args_list[0]!r}", file=sys.stderr)
        return 2
    name, rest = args_list[0], args_list[1:]
    module_name, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"disagg {name}", description=help_text)
    module.configure(parser)
    args = parser.parse_args(rest)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args))


if __name__ == "__main__":
    raise SystemExit(main())
