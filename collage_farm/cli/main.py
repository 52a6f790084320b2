"""The ``collage-farm`` parser and dispatch: one subcommand per module of this package.

Every user error (`USER_ERRORS`: bad model, unknown target, missing cost, bad config, ...)
prints ``collage-farm CMD: error: MESSAGE`` on stderr and exits with `EXIT_USAGE`; an interrupt
exits 130 and a closed stdout 141, both without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Callable, Sequence

from collage_farm.cli.cluster import add_cluster_parser, run_cluster
from collage_farm.cli.compare import add_compare_parser, run_compare
from collage_farm.cli.costs import add_costs_parser, run_costs
from collage_farm.cli.errors import EXIT_USAGE, USER_ERRORS
from collage_farm.cli.run import add_run_parser, run_run
from collage_farm.cli.targets import add_targets_parser, run_targets
from collage_farm.cli.tune import add_tune_parser, run_tune
from collage_farm.cli.zoo import add_zoo_parser, run_zoo

__all__ = ["build_parser", "main"]

#: subcommand -> what runs it (its exit status)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "tune": run_tune,
    "zoo": run_zoo,
    "costs": run_costs,
    "targets": run_targets,
    "cluster": run_cluster,
    "run": run_run,
    "compare": run_compare,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``collage-farm`` parser with every subcommand registered, in help order."""
    parser = argparse.ArgumentParser(
        prog="collage-farm",
        description="Collage partition search over ONNX models with a Ray measurement farm.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for add in (add_tune_parser, add_zoo_parser, add_costs_parser, add_targets_parser,
                add_cluster_parser, add_run_parser, add_compare_parser):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``collage-farm`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    argparse's own errors (unknown flag, missing argument) and ``--help`` raise `SystemExit`.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(COMMANDS[args.cmd](args))
    except USER_ERRORS as e:
        print(f"collage-farm {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"collage-farm {args.cmd}: interrupted; measured rows are in the cost table",
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head` closed stdout: the reader's choice, not an error
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed pipeline member
    finally:
        # an error's traceback keeps its frames (pyarrow readers of a corrupt table among
        # them) in reference cycles: collected here, while Arrow is alive, not in the
        # interpreter's final teardown, where a parquet reader thread can abort the process
        # after the error was printed (seen once in CI: exit -6, "terminate called without
        # an active exception", on a table of corrupt files; apache/arrow#34314)
        gc.collect()
