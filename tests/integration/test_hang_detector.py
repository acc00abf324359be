"""The hang detector on real jobs: a frozen rank (SIGSTOP) and a rank stuck in Python are named and
blamed, also when a waiting rank's own timeout fires first; SIGUSR1 (and ``torchring dump``) prints
every rank's stack and the job goes on; nothing is left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

from .jobs import python_script, start_job, torchring_command, wait_until_gone
from .test_metrics import free_port, scrape, value

HVD = ("--horovod-compat", *python_script("hang_hvd.py"))


class _Lines:
    """Collects a running job's stdout and stderr; ``wait_for`` blocks until a pattern appears."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.text = {"stdout": "", "stderr": ""}
        self._changed = threading.Condition()
        self._threads = [threading.Thread(target=self._read, args=(name, getattr(process, name)), daemon=True)
                         for name in self.text]
        for thread in self._threads:
            thread.start()

    def _read(self, name: str, stream) -> None:
        for line in stream:
            with self._changed:
                self.text[name] += line
                self._changed.notify_all()

    def wait_for(self, pattern: str, stream: str = "stdout", timeout: float = 60) -> re.Match:
        with self._changed:
            match = None
            self._changed.wait_for(lambda: (match := re.search(pattern, self.text[stream])) is not None
                                   or not any(t.is_alive() for t in self._threads), timeout)
            match = re.search(pattern, self.text[stream])
        assert match, f"no {pattern!r} in {stream}:\n{self.text}"
        return match

    def finish(self, process: subprocess.Popen, timeout: float = 60) -> int:
        returncode = process.wait(timeout=timeout)
        for thread in self._threads:
            thread.join(timeout=10)
        return returncode


def _summary(stderr: str) -> str:
    """The first line of the launcher's failure summary (after the hang report)."""
    return next(line for line in stderr.splitlines() if line.startswith("torchring run: rank ") and "(pid " in line)


def _frozen_rank_job(*flags: str, env: dict[str, str] | None = None) -> tuple[str, float, int]:
    process, marker = start_job("run", "-np", "2", *flags, *HVD, env=env)
    lines = _Lines(process)
    pid = int(lines.wait_for(r"\[1\]<stdout>:training rank=1 pid=(\d+)").group(1))
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    returncode = lines.finish(process)
    assert wait_until_gone(marker) == []
    return lines.text["stderr"], time.monotonic() - stopped, returncode


def test_a_frozen_rank_is_named_and_blamed_and_killed():
    stderr, took, returncode = _frozen_rank_job("--hang-timeout", "3", env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "60"})
    assert returncode == 1, stderr
    assert re.search(r"torchring run: the job is hung: rank 1 has been frozen for \d+ s \(--hang-timeout 3\)", stderr)
    assert "torchring run: rank 0: waiting in allreduce (hang_hvd.py:14)" in stderr
    assert re.search(r"torchring run: rank 1: frozen \(process state T, stopped\) for \d+ s — the odd one out", stderr)
    assert re.search(r"rank 1 \(pid \d+ on localhost\) froze \(process state T, stopped\)", _summary(stderr))
    assert took < 15, stderr
    # what torchring's runtime in rank 0 recorded: its last collectives, and the one it waits in
    assert re.search(r"torchring run:   rank 0: last collectives: allreduce 'grad' \(done [\d.]+ s ago\)", stderr), \
        stderr
    assert re.search(r"torchring run:   rank 0: waiting for other ranks: allreduce 'grad' since", stderr), stderr


def test_a_waiting_ranks_timeout_still_blames_the_frozen_rank():
    stderr, _took, returncode = _frozen_rank_job("--hang-timeout", "60", env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "2"})
    assert returncode == 1, stderr
    assert "HorovodInternalError" in stderr
    assert re.search(r"rank 1 \(pid \d+ on localhost\) froze .*; rank 0 waited for it", _summary(stderr)), stderr
    assert "rank 0 exited with code 1 as a consequence (it waited for rank 1)" in stderr


def test_a_ddp_rank_stuck_in_python_is_shown_by_function_and_line_and_blamed():
    process, marker = start_job("run", "-np", "2", "--hang-timeout", "3", *python_script("hang_ddp.py"), "stuck")
    lines = _Lines(process)
    returncode = lines.finish(process)
    stderr = lines.text["stderr"]
    assert returncode == 1, stderr
    assert "torchring run: rank 0: waiting in all_reduce (hang_ddp.py:28)" in stderr
    assert "torchring run: rank 1: in load_batch (hang_ddp.py:17)" in stderr
    assert "rank 1 (pid" in _summary(stderr) and "got stuck outside any collective" in _summary(stderr)
    report = re.search(r"full report \(every rank's whole stack\): (\S+)", stderr).group(1)
    assert 'hang_ddp.py", line 17 in load_batch' in open(report).read()
    assert wait_until_gone(marker) == []


def test_sigusr1_prints_every_ranks_stack_and_the_job_goes_on(tmp_path):
    stop = tmp_path / "stop"
    process, marker = start_job("run", "-np", "2", *python_script("hang_ddp.py"), "until", str(stop))
    lines = _Lines(process)
    lines.wait_for(r"\[1\]<stdout>:training")
    lines.wait_for(r"\[0\]<stdout>:training")
    process.send_signal(signal.SIGUSR1)
    lines.wait_for(r"full report \(every rank's whole stack\)", "stderr")
    # `torchring dump PID` asks the same from another terminal, here for the launcher (python -m torchring run)
    dumped = subprocess.run(torchring_command("dump", str(process.pid)), capture_output=True, text=True, timeout=30)
    assert dumped.returncode == 0, dumped.stderr
    assert f"==== torchring run, pid {process.pid} ====" in dumped.stdout
    assert "==== rank 0 (running" in dumped.stdout and "==== rank 1 (running" in dumped.stdout
    stop.touch()
    assert lines.finish(process) == 0, lines.text
    stderr = lines.text["stderr"]
    assert "torchring run: stacks of every rank (on request, the job goes on):" in stderr
    report = re.search(r"full report \(every rank's whole stack\): (\S+)", stderr).group(1)
    text = open(report).read()
    assert "==== rank 0 (running" in text and "==== rank 1 (running" in text and text.count("in main") >= 2
    assert "done rank=0" in lines.text["stdout"] and "done rank=1" in lines.text["stdout"]
    assert wait_until_gone(marker) == []


def test_a_straggling_rank_is_named_once_and_its_gauges_are_served(tmp_path):
    stop, port = tmp_path / "stop", free_port()
    process, marker = start_job("run", "-np", "2", "--hang-timeout", "10", "--metrics-port", str(port),
                                *python_script("straggler_job.py"), str(stop))
    lines = _Lines(process)
    try:
        warning = lines.wait_for(r"torchring run: rank 1 is a straggler: (.*)", "stderr").group(1)
        values = scrape(port)
    finally:
        stop.touch()  # the job ends either way
    assert lines.finish(process) == 0, lines.text
    assert "the last to reach the gradient reductions in" in warning, warning
    assert value(values, "torchring_straggler_last_fraction", rank="1") >= 0.8, values
    assert value(values, "torchring_straggler_lag_seconds", rank="1") > 0.01, values
    assert value(values, "torchring_straggler_last_fraction", rank="0") <= 0.2, values
    assert lines.text["stderr"].count("is a straggler") == 1, lines.text["stderr"]
    assert wait_until_gone(marker) == []
