"""Elastic membership and recovery as statistics: real elastic jobs (``tests/multihost/scripts/elastic_train.py``)
many times, with the machine busy.

    .venv/bin/python benchmarks/elastic_statistics.py [--runs 20] [--load 2] [--only races|recovery]
        [--cluster [RUNS]] [--no-local]

- ``races``: a worker killed, a host removed and another added, in a random order with random gaps of
  0..1.2 s (about one discovery interval), on this machine's loopback addresses as hosts
  (``tests/integration/elastic_jobs.random_membership_run``); right when the job exits 0 with one
  checksum on every rank, every committed sample processed once per epoch and no process left.
- ``recovery``: a worker of a 3-worker job (``--min-np 2 --max-np 3``, one free slot) SIGKILLed while it
  trains, 5 times each without and with ``--spares 1``; two figures per run: the launcher's (change
  seen -> rank 0's first step in the new generation) and the one seen from outside (the SIGKILL -> the
  first progress line rank 0 prints in the new generation). ``--cluster [RUNS]`` (root, as
  ``tests/multihost``) adds the same across three namespace hosts reached over SSH, a worker lost and a
  host lost, RUNS times each (default 3); ``--no-local`` leaves the local figures out.

``--load N`` keeps N processes spinning on the CPU meanwhile (default: as many as there are cores).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.elastic_jobs import Launcher, random_membership_run, worker_pid  # noqa: E402

RECOVERED = r"generation (\d+) trained its first step ([\d.]+) s after the (?:worker|host) lost was seen"


def _races(runs: int) -> int:
    right = 0
    with tempfile.TemporaryDirectory(prefix="torchring-races-") as tmp:
        for seed in range(runs):
            started = time.monotonic()
            ok, detail = random_membership_run(seed, Path(tmp))
            right += ok
            print(f"  {'right' if ok else 'WRONG'} {time.monotonic() - started:5.1f} s  {detail.splitlines()[0]}",
                  flush=True)
            if not ok:
                print("    " + "\n    ".join(detail.splitlines()[1:]), flush=True)
    print(f"races: {right} of {runs} right", flush=True)
    return runs - right


def _one_recovery(flags: list[str], kill: Callable[[Launcher], None], env: dict[str, str] | None = None,
                  spare_wanted: bool = False) -> tuple[float, float]:
    """(the launcher's seconds, SIGKILL -> first progress line of the new generation) for one run."""
    job = Launcher(*flags, epochs=6, env=env)
    try:
        job.wait_for(r"elastic job started with 3 workers")
        if spare_wanted:
            job.wait_for(r"hot spare w\d+ on \S+ standing by")
        while sum("progress epoch" in line for line in job.stdout) < 10:
            time.sleep(0.02)
        killed_at = time.monotonic()
        kill(job)
        job.wait_for(r"membership changed")
        changed_at = job.arrived
        launcher_s = float(job.wait_for(RECOVERED).group(2))
        while (first := _first_progress_after(job, changed_at)) is None:
            time.sleep(0.02)
        code, log = job.finish(timeout=240)
        if code != 0:
            raise RuntimeError(f"the job exited with {code}:\n{log[-2000:]}")
        return launcher_s, first - killed_at
    finally:
        if job.process.poll() is None:
            job.process.kill()
            job.process.wait()


def _first_progress_after(job: Launcher, moment: float) -> float | None:
    """When rank 0's first progress line after ``moment`` arrived, if one did."""
    lines = list(zip(job.stdout_times, job.stdout, strict=False))  # the reader appends both, times first
    return next((at for at, line in lines if at > moment and "progress epoch" in line), None)


def _kill_worker(job: Launcher) -> None:
    os.kill(worker_pid(job.marker, "w1"), signal.SIGKILL)


def _report(name: str, runs: list[tuple[float, float]]) -> None:
    launcher = [r[0] for r in runs]
    outside = [r[1] for r in runs]
    print(f"  {name:<44} launcher median {statistics.median(launcher):5.2f} s (max {max(launcher):5.2f})   "
          f"kill -> step median {statistics.median(outside):5.2f} s (max {max(outside):5.2f})", flush=True)


def _recovery(runs: int, cluster_runs: int, local: bool = True) -> None:
    flags = ["-H", "localhost:4", "--min-np", "2", "--max-np", "3"]
    if local:
        _report("local, worker lost, no spare", [_one_recovery(flags, _kill_worker) for _ in range(runs)])
        _report("local, worker lost, --spares 1",
                [_one_recovery([*flags, "--spares", "1"], _kill_worker, spare_wanted=True) for _ in range(runs)])
    if cluster_runs:
        _cluster_recovery(cluster_runs)


def _cluster_recovery(runs: int) -> None:
    from tests.multihost.cluster import Cluster, cluster_unavailable_reason

    reason = cluster_unavailable_reason()
    if reason is not None:
        print(f"  cross-host figures skipped: {reason}", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="torchring-cluster-") as state:
        cluster = Cluster.start(Path(state), num_hosts=3)
        try:
            env = cluster.env()
            pool = Path(state) / "pool"

            def job_flags(hosts: str, *more: str) -> list[str]:
                pool.write_text(hosts)
                return ["--host-discovery-script", f"cat {pool}", "--min-np", "2", "--max-np", "3", "-x", "ELASTIC_LOG",
                        "-x", "ELASTIC_STEP_SLEEP", "-x", "ELASTIC_EPOCHS", *more]

            def kill_on(host: str) -> Callable[[Launcher], None]:
                def kill(_job: Launcher) -> None:
                    for pid in cluster.pids_in(host):
                        try:
                            if b"elastic_train.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                                os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
                return kill

            def lose_host(host: str) -> Callable[[Launcher], None]:
                return lambda _job: cluster.kill_all_in(host)

            _report("3 hosts, worker lost on h3, no spare",
                    [_one_recovery(job_flags("h1:1\nh2:1\nh3:2\n"), kill_on("h3"), env) for _ in range(runs)])
            _report("3 hosts, worker lost on h2, --spares 1 (on h3)",
                    [_one_recovery(job_flags("h1:1\nh2:1\nh3:2\n", "--spares", "1"), kill_on("h2"), env, True)
                     for _ in range(runs)])
            _report("3 hosts, host h3 lost (2 ranks left)",
                    [_one_recovery(job_flags("h1:1\nh2:1\nh3:1\n"), lose_host("h3"), env) for _ in range(runs)])
        finally:
            cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of the race scenario (recovery: 5)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", choices=["races", "recovery"])
    parser.add_argument("--cluster", type=int, nargs="?", const=3, default=0, metavar="RUNS",
                        help="also across namespace hosts (root), RUNS times each (default 3)")
    parser.add_argument("--no-local", action="store_true", help="recovery: only the cross-host figures")
    args = parser.parse_args()
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    wrong = 0
    try:
        print(f"{args.load} spinning processes beside the jobs", flush=True)
        if args.only in (None, "races"):
            wrong += _races(args.runs)
        if args.only in (None, "recovery"):
            _recovery(5, args.cluster, local=not args.no_local)
    finally:
        for process in load:
            process.kill()
            process.wait()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
