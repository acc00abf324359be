"""Running ``torchring run`` (and ``horovodrun``) from a command line: the parser class whose errors
are one line, and the one path from arguments to a finished job, shared by both commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ..hosts import HostSpecError
from ..job import PreflightError, run_elastic_job, run_job
from .arguments import config_from_args
from .check_build import check_build_report
from .config_file import ConfigFileError, apply_config_file

__all__ = ["OneLineErrorParser", "run_command"]


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``prog: error: ...``), like the launcher's
    own checks, instead of the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def run_command(parser: argparse.ArgumentParser, arguments: Sequence[str], name: str,
                prepare: Callable[[argparse.Namespace], None] | None = None) -> int:
    """Parse ``arguments`` with ``parser`` (values of ``--config-file`` as its defaults), let ``prepare``
    adjust or refuse (``ValueError``) the parsed flags, run the job and return its exit code; errors are
    printed as ``name: error: ...``."""
    try:
        apply_config_file(parser, arguments)
    except ConfigFileError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    args = parser.parse_args(arguments)
    if prepare is not None:
        try:
            prepare(args)
        except ValueError as error:
            print(f"{name}: error: {error}", file=sys.stderr)
            return 2
    if args.check_build:
        print(check_build_report())
        return 0
    try:
        config = config_from_args(args)
        return run_elastic_job(config) if config.elastic is not None else run_job(config)
    except (HostSpecError, ValueError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    except PreflightError as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 1
