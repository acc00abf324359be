"""``torchring timeline summarize TRACE``: what a timeline says about communication, fusion and slow ranks.

Also runnable on its own: ``python -m torchring.diagnostics.timeline.cli summarize TRACE [--json]``.
Exit codes: 0 done, 2 bad usage or a trace that cannot be read or is not a timeline, 1 the plot failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .report import format_summary, plot, summary_to_dict
from .summary import load_trace, summarize

__all__ = ["add_timeline_arguments", "main", "run_timeline"]

PROG = "torchring timeline"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def add_timeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The commands and flags of ``torchring timeline`` (destinations start with ``timeline_``)."""
    commands = parser.add_subparsers(dest="timeline_command", metavar="COMMAND", required=True)
    summarize_parser = commands.add_parser(
        "summarize", help="top tensors, fusion, per-rank waits and steps of a timeline",
        description="Analyse a timeline written with --timeline-filename / HOROVOD_TIMELINE: the tensors that "
                    "took the most communication time, how tensors were fused, which rank the others waited "
                    "for, and communication per step.")
    summarize_parser.add_argument("timeline_trace", metavar="TRACE", help="the timeline JSON file (may be truncated)")
    summarize_parser.add_argument("--top", dest="timeline_top", metavar="N", type=_positive_int, default=10,
                                  help="how many tensors and steps to list (default 10)")
    summarize_parser.add_argument("--json", dest="timeline_json", action="store_true",
                                  help="print the summary as JSON instead of text")
    summarize_parser.add_argument("--plot", dest="timeline_plot", metavar="PATH",
                                  help="also draw communication per step into this PNG file")


def _error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


def run_timeline(args: argparse.Namespace) -> int:
    """Run the parsed ``torchring timeline`` command; return the exit code."""
    if args.timeline_command != "summarize":
        _error(f"unknown command {args.timeline_command!r}")
        return 2
    path = args.timeline_trace
    try:
        events = load_trace(path)
    except ValueError as error:
        _error(str(error))
        return 2
    except OSError as error:
        _error(f"cannot read {path}: {error.strerror or error}")
        return 2
    summary = summarize(events, source=path)
    if args.timeline_json:
        print(json.dumps(summary_to_dict(summary, top=args.timeline_top), indent=2))
    else:
        print(format_summary(summary, args.timeline_top), end="")
    if args.timeline_plot:
        try:
            written = plot(summary, args.timeline_plot)
        except (OSError, RuntimeError, ValueError) as error:
            _error(f"cannot write the plot {args.timeline_plot}: {error}")
            return 1
        print(f"plot written to {written}", file=sys.stderr if args.timeline_json else sys.stdout)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m torchring.diagnostics.timeline.cli summarize TRACE ...``."""
    parser = argparse.ArgumentParser(prog=PROG, description="Analyse a torchring (Horovod) timeline.")
    add_timeline_arguments(parser)
    args = parser.parse_args(argv)
    return run_timeline(args)


if __name__ == "__main__":
    sys.exit(main())
