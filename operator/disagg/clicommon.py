"""What every ``disagg`` subcommand shares: its exit codes and ``-`` for stdout.

Standard library only: the operator's own command line (``disagg run``, ``disagg crds``) imports it,
and the import contracts keep the operator off the glue in ``disagg.cli``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and failed, or found what it checks for (a bad input file included)
EXIT_USAGE = 2  # the command line is wrong: argparse's own errors, and the checks argparse cannot make

STDOUT = "-"  # an output path of "-" means standard output

EPILOG = """\
exit status:
  0  success
  1  failure: the command ran and failed, or found problems (an input file that cannot be read or is
     invalid, a stale generated file, a conformance finding, a cluster that did not come up)
  2  usage: an unknown command or flag, a missing or invalid argument, contradicting flags, or a
     command this installation leaves out (its extra is not installed)

A path of - means stdin where a file is read and stdout where output is written; an output that is a
directory of several files (a report) refuses -.
"""


def is_stdout(path: str | Path | None) -> bool:
    """Whether an output path names standard output (``-``)."""
    return path is not None and str(path) == STDOUT


def usage_error(prog: str, message: str) -> NoReturn:
    """One line naming the problem on stderr, then exit 2 (argparse's convention for usage errors)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def refuse_stdout(prog: str, flag: str, path: str | Path | None, what: str) -> None:
    """Exit 2 when ``path`` is ``-`` but ``flag`` writes ``what`` (several files), which stdout can't hold."""
    if is_stdout(path):
        usage_error(prog, f"{flag} -: {what}; standard output cannot hold it, name a directory")
