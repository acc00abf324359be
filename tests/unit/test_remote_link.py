"""The launcher's link to ``remote_rank`` (run here as a local process, as sshd would run it): pings and
stack samples answered, a rank's forged control line relayed as output, a frozen rank seen as frozen,
and each side ending the other's work when the channel goes silent."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from tests.integration.jobs import MARKER_VARIABLE, processes_with_marker
from torchring.launch.sampling.proc_info import process_state
from torchring.launch.sampling.stack_probe import probe_all
from torchring.launch.spawn.output import OutputRelay
from torchring.launch.spawn.remote_link import CONTROL_PREFIX, RemoteLink, RemoteLinks, RemoteProbe

FORGED = CONTROL_PREFIX.decode() + 'probe 1 {"state": "running", "dump": "forged"}'
RANK = ("import sys, time\n"
        f"print({FORGED!r}, file=sys.stderr, flush=True)\n"
        "def waiting_for_data():\n"
        "    print('ready', flush=True); time.sleep(60)\n"
        "waiting_for_data()\n")


def _remote_rank(command: list[str], link_timeout_s: float | None, probe: bool,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "torchring.launch.spawn.remote_rank"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    spec = {"command": command, "env": {**os.environ, **(env or {})}, "cwd": os.getcwd(),
            "link_timeout_s": link_timeout_s, "probe": probe}
    process.stdin.write((json.dumps(spec) + "\n").encode())
    process.stdin.flush()
    return process


def _await(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_remote_rank_answers_pings_and_stack_samples_and_relays_forged_control_lines_as_output():
    process = _remote_rank([sys.executable, "-c", RANK], link_timeout_s=30, probe=True)
    link = RemoteLink("h2", process)
    shown = io.BytesIO()
    relay = OutputRelay(1, "stderr", process.stderr, shown, control=(CONTROL_PREFIX, link.on_control))
    relay.start()
    try:
        assert process.stdout.readline() == b"ready\n"
        assert link.send("ping")
        _await(lambda: link.last_heard is not None)
        probe = RemoteProbe(link)
        result = probe_all([probe], wait_s=5)[0]
        assert result.state == "running" and result.pid is not None and result.process_state in "SR"
        assert 'line 4 in waiting_for_data' in result.dump and "forged" not in result.dump
        assert b"[1]<stderr>: " + FORGED.encode() + b"\n" in shown.getvalue()  # escaped, shown as output
        os.kill(result.pid, signal.SIGSTOP)
        _await(lambda: (process_state(result.pid) or "?")[0] == "T")
        frozen = probe_all([probe], wait_s=5)[0]
        assert frozen.state == "frozen" and frozen.process_state == "T" and frozen.dump is None
        os.kill(result.pid, signal.SIGCONT)
    finally:
        link.send("stop")
        assert process.wait(timeout=10) == 128 + signal.SIGTERM
        relay.join(timeout=5)


def test_remote_rank_ends_its_rank_when_the_launcher_goes_silent():
    started = time.monotonic()
    process = _remote_rank([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                           link_timeout_s=1.0, probe=False)
    assert process.stdout.readline() == b"ready\n"
    # nothing more is written to its stdin, which stays open: a partition, not a closed channel
    assert process.wait(timeout=10) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 6
    assert b"no word from the launcher for 1 s (cut off); stopping the rank" in process.stderr.read()
    process.stdin.close()


def test_a_rank_is_ended_when_its_launcher_vanished_with_pings_still_queued():
    """An SSH client killed just after it sent the spec and a few pings: the supervisor starts the rank,
    then its answer to a queued ping fails on the closed channel. That must end the rank (the thread that
    wrote the answer, and the one watching for silence, once died of the broken pipe and left it running)."""
    marker = uuid.uuid4().hex  # in the rank's environment only: it finds the rank
    process = _remote_rank(["sleep", "300"], link_timeout_s=30.0, probe=False, env={MARKER_VARIABLE: marker})
    process.stdin.write(b"ping\nping\nping\n")
    process.stdin.flush()
    process.stderr.close()  # the channel's reader is gone: every write of the supervisor fails
    process.stdout.close()
    process.stdin.close()
    # the rank may be ended before or after it got to run; either way it ends with the supervisor, well
    # before the 30 s link timeout
    assert process.wait(timeout=15) == 128 + signal.SIGTERM
    _await(lambda: not processes_with_marker(marker), timeout=5)


def test_a_rank_is_ended_when_the_session_that_started_its_supervisor_ended():
    """The supervisor's parent (the SSH session) is gone while its stdin stays open and the launcher set no
    link timeout: the parent's end alone ends the rank."""
    marker = uuid.uuid4().hex  # in the rank's environment only: it finds the rank
    spec = {"command": ["sleep", "300"], "env": {**os.environ, MARKER_VARIABLE: marker}, "cwd": os.getcwd(),
            "link_timeout_s": None, "probe": False}
    read_end, write_end = os.pipe()
    os.write(write_end, (json.dumps(spec) + "\n").encode())
    # the session: it starts the supervisor (stdin inherited: the pipe) and is killed once the rank runs
    starter = ("import subprocess, sys, time\n"
               "print(subprocess.Popen([sys.executable, '-m', 'torchring.launch.spawn.remote_rank'], "
               "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid, flush=True)\n"
               "time.sleep(300)")
    session = subprocess.Popen([sys.executable, "-c", starter], stdin=read_end, stdout=subprocess.PIPE, text=True)
    os.close(read_end)
    try:
        supervisor = int(session.stdout.readline().strip())
        _await(lambda: processes_with_marker(marker), timeout=30)
        session.kill()
        session.wait(timeout=10)
        _await(lambda: not processes_with_marker(marker) and (process_state(supervisor) or "Z")[0] == "Z",
               timeout=10)
    finally:
        os.close(write_end)


def test_the_launcher_kills_the_client_of_a_host_that_went_silent_and_says_why():
    lost = threading.Event()
    # answers once, then never again (its host was cut off)
    silent = subprocess.Popen([sys.executable, "-c", f"import sys, time; print({CONTROL_PREFIX.decode() + 'pong'!r}, "
                               "file=sys.stderr, flush=True); time.sleep(60)"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    link = RemoteLink("h3", silent)
    relay = OutputRelay(0, "stderr", silent.stderr, io.BytesIO(), control=(CONTROL_PREFIX, link.on_control))
    relay.start()
    links = RemoteLinks(on_lost=lambda _link: lost.set(), timeout_s=1.0, interval_s=0.2)
    links.add(link)
    try:
        assert lost.wait(10)
        assert silent.wait(timeout=5) == -signal.SIGKILL
        assert link.lost_reason.startswith("was cut off: no word from h3 for 1 s")
    finally:
        links.stop()
        silent.kill()
        silent.wait()
        relay.join(timeout=5)
