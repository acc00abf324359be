"""``torchring bench``: parse the flags, start the ranks with ``torchring run``'s machinery, print tables.

Every flag is checked before any rank starts; a bad one is a ``BenchUsageError`` (exit code 2).
Rank 0 of the job writes its results to a file in a temporary directory; the launcher reads it once
the job has ended, prints a table, and writes ``--json`` if asked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..launch.hosts import HostSlots, HostSpecError, assign_ranks, is_local_host, parse_hostfile, parse_hosts
from ..launch.job import RunConfig, run_job
from . import report
from .options import (
    DEFAULT_NEW_REQUESTS,
    DEFAULT_REQUESTS,
    DEFAULT_VIRTUAL_RANKS,
    FRAMEWORKS,
    MODEL_NAMES,
    CollectivesOptions,
    Options,
    SmallOpsOptions,
    TrainOptions,
    encode,
)
from .results import read_json, write_json_atomic
from .sizes import DEFAULT_SIZES, parse_sizes
from .stats import OPS, Summary


class BenchUsageError(ValueError):
    """A flag of ``torchring bench`` that cannot be used; the message says which and why."""


class BenchJobError(RuntimeError):
    """The benchmark job failed or left no results; ``exit_code`` is what the command returns."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _add_hosts(parser: argparse.ArgumentParser) -> None:
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", help="hosts and slots, e.g. localhost:4")
    hosts.add_argument("--hostfile", dest="hostfile", help="file with one 'host slots=N' per line")
    parser.add_argument("--json", dest="json_path", metavar="PATH", help="also write every number to this JSON file")
    parser.add_argument("--verbose", action="store_true", help="describe the launch")


def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainOptions()
    parser.add_argument("--model", choices=list(MODEL_NAMES), default=defaults.model,
                        help="model to train (default mlp)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size,
                        help=f"batch size per rank (default {defaults.batch_size})")
    parser.add_argument("--warmup-batches", type=int, default=defaults.warmup_batches,
                        help=f"untimed batches at the start of every round (default {defaults.warmup_batches})")
    parser.add_argument("--batches-per-round", type=int, default=defaults.batches_per_round,
                        help=f"timed batches per framework and round (default {defaults.batches_per_round})")
    parser.add_argument("--rounds", type=int, default=defaults.rounds,
                        help=f"rounds (one sample each; default {defaults.rounds})")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help=f"torch threads per rank (also OMP_NUM_THREADS; default {defaults.threads})")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help=f"seed of the weights and synthetic data (default {defaults.seed})")


def _add_control_plane_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``torchring bench control-plane``."""
    parser.add_argument("--virtual-ranks", dest="virtual_ranks", type=int, action="append", metavar="N",
                        help="simulate N ranks (repeat for several; default "
                             f"{' '.join(map(str, DEFAULT_VIRTUAL_RANKS))})")
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                        help=f"cached requests per steady-state cycle (default {DEFAULT_REQUESTS})")
    parser.add_argument("--new-requests", dest="new_requests", type=int, default=DEFAULT_NEW_REQUESTS,
                        help=f"new requests per new-request cycle (default {DEFAULT_NEW_REQUESTS})")
    parser.add_argument("--cycles", type=int, default=10, help="measured cycles of each kind (default 10)")
    parser.add_argument("--json", dest="json_lines", action="store_true",
                        help="print one JSON object per N instead of the table")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The modes and flags of ``torchring bench``."""
    modes = parser.add_subparsers(dest="bench_mode", metavar="MODE", required=True)
    collectives = modes.add_parser(
        "collectives", help="latency and bandwidth of torchring's collectives against raw torch.distributed",
        description="Time allreduce, allgather and broadcast of float32 tensors with torchring and with a raw "
                    "gloo group, alternating, at every size.")
    collectives.add_argument("-np", "--num-proc", dest="num_proc", type=int, required=True, help="number of ranks")
    _add_hosts(collectives)
    collectives.add_argument("--sizes", help="comma-separated sizes in bytes, K/M/G suffixes "
                                             "(default 4K,16K,...,256M: powers of 4)")
    collectives.add_argument("--ops", default=",".join(OPS), help=f"operations to time (default {','.join(OPS)})")
    collectives.add_argument("--iters", type=int, help="timed iterations per size (default: fewer for large sizes)")
    collectives.add_argument("--warmup", type=int, help="untimed iterations per size (default: up to 5)")

    train = modes.add_parser(
        "train", help="training throughput of torchring, DDP and Horovod on synthetic data",
        description="Train the same model on synthetic data with each framework, in alternating rounds inside "
                    "one job, and compare images per second.")
    train.add_argument("-np", "--num-proc", dest="num_proc", type=int, required=True, help="number of ranks")
    _add_hosts(train)
    _add_train_arguments(train)
    train.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                       help="frameworks to compare (default torchring,ddp,horovod; horovod is skipped "
                            "with a note when it cannot be used)")
    train.add_argument("--autotune", action="store_true",
                       help="also train a torchring optimizer with the autotuner on: it tunes first (warm-up and "
                            "search, HOROVOD_AUTOTUNE_* apply), then its rounds alternate with the others at the "
                            "values it chose, and its ratio to plain torchring is reported")

    scaling = modes.add_parser(
        "scaling", help="training throughput at 1..N ranks and the scaling efficiency",
        description="Run the training benchmark of one framework at 1, 2, ..., MAX_NP ranks; efficiency is "
                    "(img/s at n) / (n x img/s at 1).")
    scaling.add_argument("--max-np", dest="max_np", type=int, required=True, help="largest number of ranks")
    _add_hosts(scaling)
    _add_train_arguments(scaling)
    scaling.add_argument("--framework", choices=list(FRAMEWORKS), default="torchring",
                         help="framework to scale (default torchring)")
    scaling.add_argument("--small-ops", dest="small_ops", action="store_true",
                         help="instead of training: init() time, blocking 4 KB allreduce latency and a 200 x 4 KB "
                              "burst at 2, 4, 8, ... MAX_NP ranks, for torchring, raw c10d and (when it can be "
                              "imported) the real Horovod, each in jobs of its own; --rounds burst samples and 5x "
                              "as many latency samples per job")

    control_plane = modes.add_parser(
        "control-plane", help="bytes and CPU time of one negotiation cycle per rank at N virtual ranks",
        description="Run the engine's coordination code (response cache, announcement, negotiation, fusion "
                    "plan) for N virtual ranks in this process and report what one cycle costs a rank, in "
                    "a training loop's steady state and with new requests. No ranks are started.")
    _add_control_plane_arguments(control_plane)


def _hosts(args: argparse.Namespace, num_proc: int) -> list[HostSlots]:
    if args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    elif args.hosts:
        hosts = parse_hosts(args.hosts)
    else:
        hosts = [HostSlots("localhost", max(num_proc, 1))]
    assignments = assign_ranks(hosts, num_proc)
    remote = sorted({slot.hostname for slot in assignments if not is_local_host(slot.hostname)})
    if remote:
        raise HostSpecError(f"host(s) {', '.join(remote)} are not this machine; this version of torchring "
                            "starts ranks on the local host only")
    return hosts


def _names(text: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    names: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        if not name:
            continue
        if name not in allowed:
            raise BenchUsageError(f"{flag}: unknown name {name!r}; choose from {', '.join(allowed)}")
        if name not in names:
            names.append(name)
    if not names:
        raise BenchUsageError(f"{flag}: give at least one of {', '.join(allowed)}")
    return tuple(names)


def _at_least(value: int | None, minimum: int, flag: str) -> None:
    if value is not None and value < minimum:
        raise BenchUsageError(f"{flag} must be at least {minimum}, got {value}")


def _check_json_path(path: str | None) -> None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise BenchUsageError(f"--json {path!r}: directory {str(Path(path).resolve().parent)!r} does not exist")


def collectives_options(args: argparse.Namespace) -> CollectivesOptions:
    """Checked options of ``torchring bench collectives``."""
    try:
        sizes = tuple(parse_sizes(args.sizes)) if args.sizes is not None else DEFAULT_SIZES
    except ValueError as error:
        raise BenchUsageError(f"--sizes: {error}") from None
    _at_least(args.iters, 1, "--iters")
    _at_least(args.warmup, 0, "--warmup")
    return CollectivesOptions(_names(args.ops, OPS, "--ops"), sizes, args.iters, args.warmup)


def train_options(args: argparse.Namespace, frameworks: tuple[str, ...]) -> TrainOptions:
    """Checked options of ``torchring bench train`` (and of every job of ``scaling``)."""
    _at_least(args.batch_size, 1, "--batch-size")
    _at_least(args.warmup_batches, 0, "--warmup-batches")
    _at_least(args.batches_per_round, 1, "--batches-per-round")
    _at_least(args.rounds, 1, "--rounds")
    _at_least(args.threads, 1, "--threads")
    return TrainOptions(args.model, args.batch_size, args.warmup_batches, args.batches_per_round, args.rounds,
                        frameworks, args.threads, args.seed)


def launch(mode: str, options: Options, num_proc: int, hosts: list[HostSlots], verbose: bool = False,
           env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``num_proc`` ranks of the ``mode`` benchmark and return rank 0's results."""
    with tempfile.TemporaryDirectory(prefix="torchring-bench-") as directory:
        result_path = Path(directory) / "result.json"
        command = [sys.executable, "-m", "torchring.bench.worker", mode, encode(options, str(result_path))]
        config = RunConfig(num_proc, hosts, command, ranks_to_show=frozenset({0}), verbose=verbose,
                           tuning=dict(env or {}))
        where = ", ".join(f"{h.hostname}:{h.slots}" for h in hosts) if hosts else "this host"
        print(f"torchring bench {mode}: starting {num_proc} rank(s) on {where} (each loads torch first, which "
              "takes a few seconds); rank 0 reports below as it measures", file=sys.stderr, flush=True)
        code = run_job(config)
        if code != 0:
            raise BenchJobError(f"the {mode} benchmark job ({num_proc} ranks) failed with exit code {code}", code)
        if not result_path.exists():
            raise BenchJobError(f"the {mode} benchmark job ended without results from rank 0")
        return read_json(result_path)


def _finish(result: dict[str, Any], args: argparse.Namespace, argv: Sequence[str] | None,
            table: Callable[[dict[str, Any]], str]) -> int:
    result["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["command"] = ["torchring", *(argv if argv is not None else sys.argv[1:])]
    print()
    print(report.describe_job(result))
    print()
    print(table(result))
    if result["mode"] == "collectives":
        print(report.COLLECTIVES_LEGEND)
        burst = report.burst_line(result)
        if burst:
            print(burst)
    if result["mode"] == "train" and "torchring" in result.get("frameworks", {}):
        print(report.TRAIN_LEGEND)
    for line in report.notes(result):
        print(line)
    if args.json_path:
        write_json_atomic(args.json_path, result)
        print(f"\nwrote {args.json_path}")
    return 0


def _run_scaling(args: argparse.Namespace, hosts: list[HostSlots], options: TrainOptions,
                 env: dict[str, str]) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    for num_proc in range(1, args.max_np + 1):
        print(f"torchring bench scaling: {args.framework} on {num_proc} rank(s)", flush=True)
        result = launch("train", options, num_proc, hosts, args.verbose, env)
        if args.framework not in result["frameworks"]:
            reason = result.get("skipped", {}).get(args.framework, "no measurements")
            raise BenchJobError(f"{args.framework} could not be measured: {reason}")
        entry = result["frameworks"][args.framework]
        runs.append({"world_size": num_proc, "img_per_sec": entry["img_per_sec"], "summary": entry["summary"],
                     "meta": result["meta"]})
        meta = result["meta"]
    single = runs[0]["summary"]["mean"]
    for run in runs:
        run["efficiency"] = run["summary"]["mean"] / (run["world_size"] * single)
    return {"mode": "scaling", "framework": args.framework, "model": options.model,
            "batch_size": options.batch_size, "warmup_batches": options.warmup_batches,
            "batches_per_round": options.batches_per_round, "rounds": options.rounds, "runs": runs, "meta": meta,
            "efficiency_summary": Summary.of([run["efficiency"] for run in runs]).to_dict()}


def run_bench(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run the benchmark ``args.bench_mode`` asks for; usage errors raise ``BenchUsageError``/``HostSpecError``
    before any rank starts, a failed job raises ``BenchJobError``."""
    if args.bench_mode == "control-plane":
        try:
            from .control_plane import run_control_plane  # loads torch, which parsing the flags does not need

            return run_control_plane(args)
        except ValueError as error:
            raise BenchUsageError(str(error)) from None
    _check_json_path(args.json_path)
    if args.bench_mode == "collectives":
        _at_least(args.num_proc, 1, "-np")
        options: Options = collectives_options(args)
        hosts = _hosts(args, args.num_proc)
        return _finish(launch("collectives", options, args.num_proc, hosts, args.verbose), args, argv,
                       report.collectives_table)
    _at_least(args.threads, 1, "--threads")
    env = {"OMP_NUM_THREADS": str(args.threads)}
    if args.bench_mode == "train":
        _at_least(args.num_proc, 1, "-np")
        frameworks = _names(args.frameworks, FRAMEWORKS, "--frameworks")
        options = train_options(args, frameworks + (("autotune",) if args.autotune else ()))
        hosts = _hosts(args, args.num_proc)
        return _finish(launch("train", options, args.num_proc, hosts, args.verbose, env), args, argv,
                       report.train_table)
    _at_least(args.max_np, 1, "--max-np")
    if args.small_ops:
        _at_least(args.max_np, 2, "--max-np")
        _at_least(args.rounds, 1, "--rounds")
        hosts = _hosts(args, args.max_np)
        small = SmallOpsOptions(latency_rounds=5 * args.rounds, burst_rounds=args.rounds)
        from . import small_ops  # it loads torch, which the other commands' parsing does not need

        result = small_ops.run_jobs(small_ops.job_sizes(args.max_np),
                                    lambda options, size: launch("small-ops", options, size, hosts, args.verbose, env),
                                    small)
        return _finish(result, args, argv, small_ops.small_ops_table)
    options = train_options(args, (args.framework,))
    hosts = _hosts(args, args.max_np)
    return _finish(_run_scaling(args, hosts, options, env), args, argv, report.scaling_table)
