"""``make test``: the test suite as two groups run at the same time, then both reports, then the
container tests.

The multi-host tests spend most of their time waiting (on SSH, elastic timeouts, lost hosts) while the
unit and integration tests mostly compute, so on a 2-core machine running them side by side finishes
the suite in about 60% of the time it takes one after the other; the integration tests that train
examples run in the multi-host group, which evens out the two. Each group is one ordinary pytest
run with its own log; while they run, a line every 30 s shows how far each has got; at the end both
logs are printed whole (each with its slowest tests and skip reasons). Then the container tests
(tests/containers: a real Docker Engine, image builds) run alone, their output shown as it comes, and
one line gives the totals of all three.

Why not pytest-xdist: the multi-host tests share one session-scoped cluster of namespace hosts that
must never have two users, so they have to stay in one worker, and the slow integration files still
need the hand-made balance below; xdist's ``--dist loadgroup`` would add a dependency without removing
either.

Arguments are passed to every pytest run (``make test PYTEST_ARGS="-k launcher"``). Arguments that
name test paths run just those, in one pytest run, as ``pytest ARGS`` would.
"""

from __future__ import annotations

import compileall
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Integration tests that train real models for a while: run beside the multi-host tests, which mostly
#: wait, so that both groups take about as long.
BALANCED = ["tests/integration/test_examples.py", "tests/integration/test_gpu_check_script.py",
            "tests/integration/test_horovod_compat.py", "tests/integration/test_elastic_recovery.py",
            "tests/integration/test_gradient_lane_faults.py"]
GROUPS = {"unit+integration": ["tests/unit", "tests/integration", *(f"--ignore={path}" for path in BALANCED)],
          "multihost+examples": ["tests/multihost", *BALANCED]}
#: The container tests (a real Docker Engine): after the two groups, alone.
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
    """Run :data:`GROUPS` at the same time, print both logs; their exit statuses and summed totals."""
    started = time.monotonic()
    totals: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="torchring-tests-") as logs:
        runs = {}
        for name, paths in GROUPS.items():
            log = Path(logs) / f"{name}.log"
            with log.open("w") as out:
                runs[name] = (subprocess.Popen([*pytest, *paths, *args], cwd=ROOT, stdout=out,
                                               stderr=subprocess.STDOUT), log)
        print(f"tests: running {' and '.join(GROUPS)} side by side; reports follow when both are done", flush=True)
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
    print(f"\ntests: both groups done in {time.monotonic() - started:.0f}s "
          f"(exit status {_exit_status(codes)}; errors count as failed)", flush=True)
    return codes, totals


def _containers(pytest: list[str], args: list[str]) -> tuple[int, dict[str, int]]:
    """Run :data:`CONTAINERS` alone (they build an image and start containers: they would slow the
    other groups), its output shown as it comes; its exit status and totals."""
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
