"""The hang detector on real processes (no launcher): what it can and cannot sample, and when it
declares a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from torchring.contract import STACK_FILE
from torchring.launch.sampling.stack_probe import STACK_HOOK_PATH, StackProbe, prepare_stack_files, probe_all
from torchring.launch.watch.hang_detector import HangDetector

#: "ready" and the sleep on one line, so a dump taken as soon as "ready" arrives shows that line.
SLEEPER = "import time\nprint('ready', flush=True); time.sleep(60)\n"


#: Three threads and the main thread busy in Python: the case where a signal-handler dump can crash.
BUSY = """import threading
def spin(depth=0):
    return spin(depth + 1) if depth < 20 else sum(range(20))
def worker():
    while True:
        spin()
for _ in range(3):
    threading.Thread(target=worker, daemon=True).start()
def main_loop():
    print('ready', flush=True)
    while True:
        spin()
main_loop()
"""
#: The main thread in one C call that holds the GIL for minutes (catastrophic backtracking in ``re``).
GIL_HELD = "import re\nprint('ready', flush=True); re.match('(a*)*b', 'a' * 40)\n"


def _python_rank(stack_file: Path, code: str = SLEEPER) -> subprocess.Popen:
    env = {**os.environ, STACK_FILE: str(stack_file), "PYTHONPATH": str(STACK_HOOK_PATH)}
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    assert process.stdout.readline() == "ready\n"
    return process


def _detector(timeout_s: float, logged: list[str]) -> tuple[HangDetector, threading.Event, threading.Event]:
    """A detector logging into ``logged``; events for "the job is hung" and "a report was printed"."""
    hung, reported = threading.Event(), threading.Event()

    def log(message: str) -> None:
        logged.append(message)
        if message.startswith("full report"):
            reported.set()

    return HangDetector(timeout_s, log, hung.set), hung, reported


def test_with_a_rank_it_cannot_sample_only_a_frozen_rank_makes_a_hang(tmp_path):
    logged: list[str] = []
    detector, hung, _reported = _detector(1, logged)
    stack_file, _ = prepare_stack_files(tmp_path / "rank0")
    python = _python_rank(stack_file)
    opaque = subprocess.Popen(["sleep", "60"], start_new_session=True)  # not Python: no stack to sample
    try:
        detector.add(0, python, StackProbe(python.pid, stack_file))
        detector.add(1, opaque, None)
        detector.start()
        # rank 0's stack never changes, but rank 1 might be busy: no hang
        assert not hung.wait(2.5), logged
        assert [s.state for s in detector.sample()] == ["running", "unsampled"]
        os.kill(python.pid, signal.SIGSTOP)
        assert hung.wait(10), logged
        assert detector.verdict is not None and detector.verdict.ranks == [0]
        assert "froze (process state T, stopped)" in detector.verdict.reason
        assert any(line.startswith("rank 0: frozen (process state T, stopped)") for line in logged), logged
    finally:
        detector.stop()
        for process in (python, opaque):
            process.kill()
            process.wait()


def test_no_sampling_without_a_timeout_but_a_report_on_request(tmp_path):
    logged: list[str] = []
    detector, hung, reported = _detector(0, logged)
    stack_file, _ = prepare_stack_files(tmp_path / "rank0")
    python = _python_rank(stack_file)
    try:
        detector.add(0, python, StackProbe(python.pid, stack_file))
        detector.start()
        assert not hung.wait(1.5) and stack_file.read_text().count("\n") == 1  # only the hook's header line
        detector.request_report()
        assert reported.wait(10), logged
        assert "rank 0: in <module> (<string>:2); stack unchanged for 0 s" in logged, logged
        assert detector.verdict is None
    finally:
        detector.stop()
        python.kill()
        python.wait()


def test_dumps_while_every_thread_runs_python_come_from_the_dump_thread_and_never_crash_the_rank(tmp_path):
    stack_file, _ = prepare_stack_files(tmp_path / "rank0")
    python = _python_rank(stack_file, BUSY)
    probe = StackProbe(python.pid, stack_file)
    try:
        for _ in range(60):
            result = probe_all([probe])[0]
            assert python.poll() is None, "the rank crashed while its stack was taken"
            assert result.state == "running" and not probe.signalled
            assert "in main_loop" in result.dump and result.dump.count("in worker") == 3
    finally:
        python.kill()
        python.wait()


def test_a_rank_holding_the_gil_in_a_c_call_is_dumped_by_faulthandler_instead(tmp_path):
    stack_file, _ = prepare_stack_files(tmp_path / "rank0")
    python = _python_rank(stack_file, GIL_HELD)
    try:
        result = probe_all([StackProbe(python.pid, stack_file)], wait_s=5)[0]
        assert result.state == "running" and result.dump is not None
        assert 'File "<string>", line 2 in <module>' in result.dump
    finally:
        python.kill()
        python.wait()


def test_the_next_sample_comes_at_the_deadline_when_that_is_sooner_than_an_interval():
    import subprocess as sp
    import time as clock

    from torchring.launch.watch.hang_detector import HangDetector

    detector = HangDetector(20.0, log=lambda line: None, on_hang=lambda: None)
    assert detector.interval_s == 2.0
    process = sp.Popen(["sleep", "30"])
    try:
        detector.add(0, process, None)
        assert abs(detector._next_wait() - 2.0) < 0.01  # far from the deadline: one interval
        detector._tracked[0].changed_at = clock.monotonic() - 19.5
        assert 0.4 < detector._next_wait() <= 0.5  # the deadline comes first
        detector._tracked[0].changed_at = clock.monotonic() - 25
        assert detector._next_wait() == 2.0  # past it without a verdict: the usual pace, not a busy loop
    finally:
        process.kill()
        process.wait()
