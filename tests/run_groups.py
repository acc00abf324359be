"""``make test``: the test suite as three groups run at the same time, then their reports, then the
container tests.

The multi-host tests spend most of their time waiting (on SSH, elastic timeouts, lost hosts, Slurm and
Ray daemons) while the unit and integration tests mostly compute. Each pytest run tests one file after
another, so on a 2-core machine the suite ends soonest when several runs share the cores: the multi-host
tests are split in two halves, each with a cluster of namespace hosts of its own
(``TORCHRING_TEST_CLUSTER``, see tests/multihost/cluster.py), and each half is given the integration
files that fill it up to about the length of the third group, the unit and the other integration tests.
Each group is one ordinary pytest run with its own log; while they run, a line every 30 s shows how far
each has got; at the end every log is printed whole (each with its slowest tests and skip reasons). Then
the container tests (tests/containers: a real Docker Engine, image builds) run alone, their output shown
as it comes, and one line gives the totals of all.

Why not pytest-xdist: a cluster of namespace hosts must never have two users (its tests kill whatever
runs on a host and check that hosts are empty), so each half of the multi-host tests has to stay in one
worker, and the slow integration files still need the hand-made balance below; xdist's ``--dist
loadgroup`` would add a dependency without removing either.

Arguments are passed to every pytest run (``make test PYTEST_ARGS="-k launcher"``). Arguments that
name test paths run just those, in one pytest run, as ``pytest ARGS`` would.
"""

from __future__ import annotations

import compileall
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ELASTIC_HOSTS = ["tests/multihost/test_elastic.py", "tests/multihost/test_hangs_and_partitions.py"]
#: Integration files beside each half of the multi-host tests, chosen by their time in full runs (the elastic
#: half took about 270-300 s, the other half about 285-320 s, unit and integration tests together 735 s when
#: run beside them; with this split the last group ended at 650-735 s on 2 cores kept 95% busy). The GPU
#: check's three jobs (about 35 s) moved to the schedulers' half on 2026-12-07, when the elastic half ended
#: last, at 600-610 s, and the schedulers' half 50-60 s before it.
BESIDE_ELASTIC_HOSTS = ["tests/integration/test_examples.py", "tests/integration/test_horovod_compat.py",
                        "tests/integration/test_elastic_recovery.py", "tests/integration/test_gradient_lane_faults.py",
                        "tests/integration/test_hang_detector.py", "tests/integration/test_doctor.py"]
BESIDE_SCHEDULERS = ["tests/integration/test_blame.py", "tests/integration/test_bench.py",
                     "tests/integration/test_k8s_rank_discovery.py", "tests/integration/test_retired_groups.py",
                     "tests/integration/test_gpu_check_script.py"]
#: name -> (the cluster of namespace hosts it may build, its pytest arguments)
GROUPS = {
    "multihost-elastic": ("0", [*ELASTIC_HOSTS, *BESIDE_ELASTIC_HOSTS]),
    "multihost-schedulers": ("1", ["tests/multihost", *(f"--ignore={path}" for path in ELASTIC_HOSTS),
                                   *BESIDE_SCHEDULERS]),
    "unit+integration": ("0", ["tests/unit", "tests/integration",
                               *(f"--ignore={path}" for path in [*BESIDE_ELASTIC_HOSTS, *BESIDE_SCHEDULERS])]),
}
#: The container tests (a real Docker Engine): after the groups, alone.
CONTAINERS = ["tests/containers"]
PROGRESS_EVERY_S = 30.0
#: pytest's exit status when it collected no test (e.g. ``-k`` matched nothing in one group).
NO_TESTS = 5


def _names_paths(args: list[str]) -> bool:
    return any(not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists() for arg in args)


def _progress(log: Path) -> str:
    found = re.findall(r"\[\s*(\d+)%\]", log.read_text(errors="replace"))
    return f"{found[-1]}%" if found else "starting"


def _totals(text: str) -> dict[str, int]:
    summary = [line for line in text.splitlines() if re.search(r"=+ .*\d+ (passed|failed|error|skipped)", line)]
    counts: dict[str, int] = {}
    if summary:
        for number, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", summary[-1]):
            kind = "error" if kind.startswith("error") else kind
            counts[kind] = counts.get(kind, 0) + int(number)
    return counts


def _exit_status(codes: list[int]) -> int:
    failures = [code for code in codes if code not in (0, NO_TESTS)]
    if failures:
        return failures[0]
    return 0 if 0 in codes else NO_TESTS


def _side_by_side(pytest: list[str], args: list[str]) -> tuple[list[int], dict[str, int]]:
    """Run :data:`GROUPS` at the same time, print their logs; their exit statuses and summed totals."""
    started = time.monotonic()
    totals: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="torchring-tests-") as logs:
        runs = {}
        for name, (cluster, paths) in GROUPS.items():
            log = Path(logs) / f"{name}.log"
            with log.open("w") as out:
                runs[name] = (subprocess.Popen([*pytest, *paths, *args], cwd=ROOT, stdout=out,
                                               stderr=subprocess.STDOUT,
                                               env={**os.environ, "TORCHRING_TEST_CLUSTER": cluster}), log)
        print(f"tests: running {', '.join(GROUPS)} side by side; reports follow when all are done", flush=True)
        while any(process.poll() is None for process, _ in runs.values()):
            deadline = time.monotonic() + PROGRESS_EVERY_S
            running = [process for process, _ in runs.values() if process.poll() is None]
            for process in running:  # wake at the progress tick, or as soon as a running group ends
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    continue
            elapsed = time.monotonic() - started
            states = [f"{name} {'done' if process.poll() is not None else _progress(log)}"
                      for name, (process, log) in runs.items()]
            print(f"tests: {elapsed // 60:.0f}m{elapsed % 60:02.0f}s: {', '.join(states)}", flush=True)
        for name, (process, log) in runs.items():
            text = log.read_text(errors="replace")
            print(f"\n{'#' * 30} {name} (pytest exit status {process.returncode}) {'#' * 30}\n{text}", flush=True)
            _add(totals, _totals(text))
    codes = [process.returncode for process, _ in runs.values()]
    print(f"\ntests: all groups done in {time.monotonic() - started:.0f}s "
          f"(exit status {_exit_status(codes)}; errors count as failed)", flush=True)
    return codes, totals


def _containers(pytest: list[str], args: list[str]) -> tuple[int, dict[str, int]]:
    """Run :data:`CONTAINERS` alone (they build an image and start containers: they would slow the
    groups), its output shown as it comes; its exit status and totals."""
    started = time.monotonic()
    print(f"\n{'#' * 30} containers (a real Docker Engine; the first run builds the image) {'#' * 30}", flush=True)
    process = subprocess.Popen([*pytest, *CONTAINERS, *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    text = []
    for line in process.stdout:
        text.append(line)
        print(line, end="", flush=True)
    process.wait()
    print(f"tests: containers done in {time.monotonic() - started:.0f}s (exit status {process.returncode})")
    return process.returncode, _totals("".join(text))


def _add(totals: dict[str, int], more: dict[str, int]) -> None:
    for kind, number in more.items():
        totals[kind] = totals.get(kind, 0) + number


def _compile_sources() -> None:
    """Write the bytecode of the project's own sources once, before hundreds of test processes import them:
    where ``PYTHONDONTWRITEBYTECODE`` is set (as on the CI machines) no process writes it, and each one
    compiled torchring again (0.15-0.25 s of CPU per process, about 50 s of the suite on 2 cores)."""
    for directory in ("src", "tests", "examples", "benchmarks"):
        compileall.compile_dir(ROOT / directory, quiet=1, workers=0)


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    _compile_sources()
    if _names_paths(args):
        return subprocess.call([*pytest, *args], cwd=ROOT)
    started = time.monotonic()
    codes, totals = _side_by_side(pytest, args)
    code, container_totals = _containers(pytest, args)
    _add(totals, container_totals)
    status = _exit_status([*codes, code])
    failed = totals.get("failed", 0) + totals.get("error", 0)
    skipped = f", {totals['skipped']} skipped" if totals.get("skipped") else ""
    print(f"\ntests: all done in {time.monotonic() - started:.0f}s (exit status {status}; errors count as failed)")
    print(f"total: {totals.get('passed', 0)} passed, {failed} failed{skipped}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
