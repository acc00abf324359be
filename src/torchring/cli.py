"""The ``torchring`` command: ``torchring run ...`` and ``torchring --version``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .launch.hosts import HostSpecError
from .launch.run import add_run_arguments, config_from_args, run_job
from .version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchring", description="Distributed PyTorch training, Horovod style.")
    parser.add_argument("--version", action="version", version=f"torchring {__version__}")
    commands = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    run = commands.add_parser("run", help="start a training job's ranks",
                              description="Start NP ranks of COMMAND and supervise them.")
    add_run_arguments(run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``torchring`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.subcommand is None:
        parser.print_help()
        return 2
    try:
        return run_job(config_from_args(args))
    except (HostSpecError, ValueError) as error:
        print(f"torchring run: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"torchring run: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
