"""Running ``torchring run`` (and ``horovodrun``) from a command line: the parser class whose errors
are one line, and the one path from arguments to a finished job, shared by both commands."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..hosts import HostSpecError
from ..job import PreflightError, run_elastic_job, run_job
from .arguments import config_from_args
from .check_build import check_build_report
from .config_file import ConfigFileError, apply_config_file

__all__ = ["OneLineErrorParser", "run_command"]


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``prog: error: ...``), like the launcher's
    own checks, instead of the whole usage, with "did you mean" for a mistyped flag or subcommand. Flags
    are never abbreviated (``--verbos`` is an error, not ``--verbose``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}{self._suggestion(message)} (see {self.prog} --help)\n")

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        """argparse matches a single-dash prefix (``-n`` for ``-np``) even without ``allow_abbrev``; only
        a short flag with its value attached (``-p2222``) is kept."""
        found = super()._get_option_tuples(option_string)
        if self.allow_abbrev or option_string[1:2] in self.prefix_chars:
            return found
        return [match for match in found if match[1] == option_string[:2]]

    def _suggestion(self, message: str) -> str:
        """``; did you mean --timeline-filename?`` for the unknown flags or choice in ``message``."""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            known, typed = re.findall(r"'([^']*)'", choice.group(2)), [choice.group(1)]
        elif message.startswith("unrecognized arguments:"):
            known = list(self._option_string_actions)
            typed = [word.split("=", 1)[0] for word in message.split(":", 1)[1].split() if word.startswith("-")]
        else:
            return ""
        guesses = [match[0] for word in typed for match in [difflib.get_close_matches(word, known, n=1, cutoff=0.6)]
                   if match]
        return f"; did you mean {' '.join(guesses)}?" if guesses else ""


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
