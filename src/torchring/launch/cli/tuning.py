"""horovodrun's tuning flags, turned into the variables every rank reads at ``hvd.init()``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """The tuning flags of horovodrun, with the same names."""
    group = parser.add_argument_group("tuning (each sets the TORCHRING_ variable of the same name for every rank)")
    group.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MB (0: no fusion)")
    group.add_argument("--cycle-time-ms", type=float, help="engine cycle time in milliseconds")
    group.add_argument("--cache-capacity", type=int, help="response cache entries (0: no cache)")
    group.add_argument("--disable-cache", action="store_true", help="turn the response cache off (--cache-capacity 0)")
    group.add_argument("--gloo-timeout-seconds", type=float,
                       help="seconds one collective may wait for a peer (default 30)")
    group.add_argument("--timeline-filename", help="rank 0 writes a Chrome-trace timeline to this file")
    group.add_argument("--timeline-mark-cycles", action="store_true", help="mark engine cycles in the timeline")
    group.add_argument("--no-stall-check", action="store_true", help="disable the stall inspector")
    group.add_argument("--stall-check-warning-time-seconds", type=float,
                       help="warn about operations waiting this long for other ranks (default 60)")
    group.add_argument("--stall-check-shutdown-time-seconds", type=float,
                       help="stop the job when operations wait this long (default 0: never)")
    group.add_argument("--log-level", choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"],
                       type=str.upper, help="torchring's log level on every rank")


#: (flag attribute, variable suffix, how the flag's value is written) for every tuning flag.
_FLAG_VARIABLES: list[tuple[str, str, Callable[[Any], str]]] = [
    ("fusion_threshold_mb", "FUSION_THRESHOLD", lambda megabytes: str(int(megabytes * 1024 * 1024))),
    ("cycle_time_ms", "CYCLE_TIME", str),
    ("cache_capacity", "CACHE_CAPACITY", str),
    ("disable_cache", "CACHE_CAPACITY", lambda _: "0"),  # horovodrun's --disable-cache (after: it wins)
    ("gloo_timeout_seconds", "GLOO_TIMEOUT_SECONDS", lambda seconds: f"{seconds:g}"),
    ("timeline_filename", "TIMELINE", str),
    ("timeline_mark_cycles", "TIMELINE_MARK_CYCLES", lambda _: "1"),
    ("no_stall_check", "STALL_CHECK_DISABLE", lambda _: "1"),
    ("stall_check_warning_time_seconds", "STALL_CHECK_TIME_SECONDS", str),
    ("stall_check_shutdown_time_seconds", "STALL_SHUTDOWN_TIME_SECONDS", str),
    ("log_level", "LOG_LEVEL", str),
]


def tuning_environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``TORCHRING_*`` variables for the tuning flags that were given (flags win over the environment)."""
    if args.fusion_threshold_mb is not None and args.fusion_threshold_mb < 0:
        raise ValueError("--fusion-threshold-mb must be >= 0")
    if args.gloo_timeout_seconds is not None and args.gloo_timeout_seconds <= 0:
        raise ValueError(f"--gloo-timeout-seconds {args.gloo_timeout_seconds:g}: must be positive")
    env: dict[str, str] = {}
    for attribute, variable, written in _FLAG_VARIABLES:
        value = getattr(args, attribute)
        if value is not None and value is not False and value != "":
            env[f"TORCHRING_{variable}"] = written(value)
    return env
