"""Failure handling as a statistic: the same faulty job many times with the machine busy, counting how
often ``torchring run`` names the right rank (and, for diverged ranks, how long it took).

    .venv/bin/python benchmarks/blame_statistics.py [--runs 20] [--load 2] [--only raise|diverge|hang] [--match TEXT]

Scenarios (each run is a real ``torchring run`` job, ``tests/integration/scripts``):

- ``raise``: rank 1 raises ``ValueError`` at step 20 of a ``DistributedOptimizer`` loop and of a plain
  DDP loop, at 2 and 3 ranks; right when the summary's first line names rank 1 as having raised it.
- ``diverge``: rank 1 alone submits an extra named allreduce (2 ranks), Horovod's test_torch.py
  divergence (ranks 0,2 in a barrier, rank 1 in one more reducescatter, 3 ranks), and rank 1's extra
  allreduce in a ``DistributedOptimizer`` loop while rank 0 waits in its gradient lane (2 ranks);
  right when rank 1 is blamed for a deadlock and the whole job (start-up included) took under 20 s.

- ``hang``: ``--hang-timeout 5``: rank 1 of a ``DistributedOptimizer`` loop is SIGSTOPped (right: named
  as frozen within the timeout + 2 sampling intervals + 1 s of the signal), and rank 1 of an
  ``hvd.allreduce`` loop sleeps before its allreduce (right: the report within the timeout + one
  interval + 1 s of the sleep, saying ``no rank made progress for 5 s`` or ``6 s``, rank 1 blamed).
  Times run from the line the faulty rank prints to the report's first line, as they reach the launcher.

``--load N`` keeps N processes spinning on the CPU meanwhile (default: as many as there are cores).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "tests" / "integration" / "scripts"
SUMMARY = re.compile(r"^torchring run: rank (\d+) \(pid \d+ on [^)]*\) (.*)$", re.MULTILINE)


def _job(args: list[str], timeout: float = 120) -> tuple[int, str, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "torchring", "run", *args], capture_output=True, text=True,
                            timeout=timeout, check=False)
    return result.returncode, result.stderr, time.monotonic() - started


def _raise_case(mode: str, np: int) -> tuple[bool, str, float]:
    code, stderr, took = _job(["-np", str(np), sys.executable, str(SCRIPTS / "fault_in_training.py"), mode, "raise"])
    match = SUMMARY.search(stderr)
    right = code == 1 and match is not None and match.group(1) == "1" and "raised ValueError" in match.group(2)
    return right, match.group(0) if match else stderr[-300:], took


def _diverge_case(case: str, np: int) -> tuple[bool, str, float]:
    code, stderr, took = _job(["--horovod-compat", "-np", str(np), sys.executable, str(SCRIPTS / "diverge_hvd.py"),
                               case])
    match = SUMMARY.search(stderr)
    right = code == 1 and match is not None and match.group(1) == "1" and "diverged" in match.group(2) and took < 20
    return right, match.group(0) if match else stderr[-300:], took


def _timed_job(args: list[str], fault_line: str, on_fault=None) -> tuple[int, str, float | None]:
    """Run a job reading its output as it comes; seconds from ``fault_line`` (stdout) to the hang
    report's first line (stderr), or None when either never came."""
    process = subprocess.Popen([sys.executable, "-m", "torchring", "run", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen: dict[str, float] = {}
    stderr: list[str] = []

    def read_stdout() -> None:
        for line in process.stdout:
            if fault_line in line and "fault" not in seen:
                seen["fault"] = time.monotonic()
                if on_fault is not None:
                    on_fault(line)

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    for line in process.stderr:
        stderr.append(line)
        if "the job is hung" in line and "report" not in seen:
            seen["report"] = time.monotonic()
    process.wait(timeout=120)
    reader.join(timeout=10)
    took = seen["report"] - seen["fault"] if "fault" in seen and "report" in seen else None
    return process.returncode, "".join(stderr), took


def _frozen_case(timeout_s: float) -> tuple[bool, str, float]:
    def freeze(line: str) -> None:
        os.kill(int(line.rsplit("pid=", 1)[1]), signal.SIGSTOP)

    code, stderr, took = _timed_job(["-np", "2", "--hang-timeout", f"{timeout_s:g}", sys.executable,
                                     str(SCRIPTS / "fault_in_training.py"), "optimizer", "pid", "1", "3"],
                                    "training rank=1 pid=", freeze)
    match = SUMMARY.search(stderr)
    interval = max(timeout_s / 10, 1.0)
    right = code == 1 and match is not None and match.group(1) == "1" and "froze" in match.group(2) \
        and took is not None and took <= timeout_s + 2 * interval + 1
    return right, match.group(0) if match else stderr[-300:], took if took is not None else float("nan")


def _sleeping_case(timeout_s: float) -> tuple[bool, str, float]:
    code, stderr, took = _timed_job(["-np", "2", "--hang-timeout", f"{timeout_s:g}", sys.executable,
                                     str(SCRIPTS / "fault_in_training.py"), "allreduce", "sleep", "1", "3"],
                                    "sleeping")
    match = SUMMARY.search(stderr)
    quiet = re.search(r"no rank made progress for (\d+) s", stderr)
    interval = max(timeout_s / 10, 1.0)
    right = code == 1 and match is not None and match.group(1) == "1" and took is not None \
        and took <= timeout_s + interval + 1 and quiet is not None \
        and timeout_s <= int(quiet.group(1)) <= timeout_s + interval
    return right, match.group(0) if match else stderr[-300:], took if took is not None else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", choices=("raise", "diverge", "hang"))
    parser.add_argument("--match", default="", help="only the cases whose label contains this text")
    args = parser.parse_args()
    cases = []
    if args.only in (None, "raise"):
        names = {"optimizer": "DistributedOptimizer", "ddp": "DDP"}
        cases += [(f"raise, {names[mode]}, {np} ranks", _raise_case, mode, np)
                  for mode in ("optimizer", "ddp") for np in (2, 3)]
    if args.only in (None, "diverge"):
        cases += [("diverge, extra allreduce, 2 ranks", _diverge_case, "extra", 2),
                  ("diverge, test_torch reducescatter, 3 ranks", _diverge_case, "reducescatter", 3),
                  ("diverge, extra allreduce beside DistributedOptimizer, 2 ranks", _diverge_case, "optimizer", 2)]
    if args.only in (None, "hang"):
        cases += [("hang-timeout 5, frozen DistributedOptimizer rank (s from SIGSTOP to report)", _frozen_case, 5.0),
                  ("hang-timeout 5, rank sleeping before an allreduce (s from sleep to report)", _sleeping_case, 5.0)]
    cases = [case for case in cases if args.match in case[0]]
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    failed = False
    try:
        print(f"{args.runs} runs per case, {args.load} spinning processes beside them", flush=True)
        for label, run, *params in cases:
            right, times, wrong = 0, [], []
            for index in range(args.runs):
                ok, summary, took = run(*params)
                right += ok
                times.append(took)
                if not ok:
                    wrong.append(f"    run {index + 1}: {summary}")
            failed |= right < args.runs
            print(f"{label}: right {right} of {args.runs}; took {min(times):.1f}-{max(times):.1f} s "
                  f"(median {sorted(times)[len(times) // 2]:.1f})", flush=True)
            for line in wrong:
                print(line, flush=True)
    finally:
        for process in load:
            process.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
