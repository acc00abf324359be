"""horovodrun's tuning flags, turned into the variables every rank reads at ``hvd.init()``."""

from __future__ import annotations

import argparse


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """The tuning flags of horovodrun, with the same names."""
    group = parser.add_argument_group("tuning (each sets the TORCHRING_ variable of the same name for every rank)")
    group.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MB (0: no fusion)")
    group.add_argument("--cycle-time-ms", type=float, help="engine cycle time in milliseconds")
    group.add_argument("--cache-capacity", type=int, help="response cache entries (0: no cache)")
    group.add_argument("--timeline-filename", help="rank 0 writes a Chrome-trace timeline to this file")
    group.add_argument("--timeline-mark-cycles", action="store_true", help="mark engine cycles in the timeline")
    group.add_argument("--no-stall-check", action="store_true", help="disable the stall inspector")
    group.add_argument("--stall-check-warning-time-seconds", type=float,
                       help="warn about operations waiting this long for other ranks (default 60)")
    group.add_argument("--stall-check-shutdown-time-seconds", type=float,
                       help="stop the job when operations wait this long (default 0: never)")
    group.add_argument("--log-level", choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"],
                       type=str.upper, help="torchring's log level on every rank")


def tuning_environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``TORCHRING_*`` variables for the tuning flags that were given (flags win over the environment)."""
    env: dict[str, str] = {}
    if args.fusion_threshold_mb is not None:
        if args.fusion_threshold_mb < 0:
            raise ValueError("--fusion-threshold-mb must be >= 0")
        env["TORCHRING_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        env["TORCHRING_CYCLE_TIME"] = str(args.cycle_time_ms)
    if args.cache_capacity is not None:
        env["TORCHRING_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.timeline_filename:
        env["TORCHRING_TIMELINE"] = args.timeline_filename
    if args.timeline_mark_cycles:
        env["TORCHRING_TIMELINE_MARK_CYCLES"] = "1"
    if args.no_stall_check:
        env["TORCHRING_STALL_CHECK_DISABLE"] = "1"
    if args.stall_check_warning_time_seconds is not None:
        env["TORCHRING_STALL_CHECK_TIME_SECONDS"] = str(args.stall_check_warning_time_seconds)
    if args.stall_check_shutdown_time_seconds is not None:
        env["TORCHRING_STALL_SHUTDOWN_TIME_SECONDS"] = str(args.stall_check_shutdown_time_seconds)
    if args.log_level:
        env["TORCHRING_LOG_LEVEL"] = args.log_level
    return env
