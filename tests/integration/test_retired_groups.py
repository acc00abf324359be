"""Retired process groups are destroyed by the reaper thread (``runtime/group_reaper.py``), never by
whoever drops the last reference: a Gloo group whose pair connects to a dead peer keeps its worker thread
for five times its timeout, and destroying the group waits for that thread. Before, a garbage collection
that freed such a group (an elastic job's rank 0 at exit, after it had recovered from a lost worker)
blocked for that long. Real Gloo groups in two processes, one of them killed (scripts/retired_group_dead_peer.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from torchring.runtime.startup import lazy_connection_available

from .jobs import SCRIPTS, python_script, run_job

pytestmark = pytest.mark.skipif(not lazy_connection_available(),
                                reason="this torch connects a group's full mesh when it is created (torch < 2.8)")
SCRIPT = SCRIPTS / "retired_group_dead_peer.py"


def test_a_group_whose_peer_died_is_destroyed_by_the_reaper_and_a_garbage_collection_does_not_wait_for_it():
    result = subprocess.run([sys.executable, str(SCRIPT), "wait", "1", "0"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # the old way: the collection that freed the cycle waited 5 s for the connection to the dead peer
    assert report["retire_s"] < 1.0 and report["collect_s"] < 1.0, report
    assert report["settled"], report  # the reaper dropped the group: destroyed, its threads joined
    assert "onnect" in report["work_error"], report


def test_a_process_exits_without_waiting_for_a_retired_groups_dead_peer():
    process = subprocess.Popen([sys.executable, str(SCRIPT), "exit", "6", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    printed = time.monotonic()
    code = process.wait(timeout=120)
    exited = time.monotonic() - printed
    assert code == 0, line + process.stdout.read() + (process.stderr.read() if process.stderr else "")
    report = json.loads(line)
    assert report["collect_s"] < 2.0, report
    # at most group_reaper.EXIT_SETTLE_S (5 s) for the attempts that are refused at once, then it exits while
    # the group still waits for its peer (up to 30 s), and never aborts (the exit status above)
    assert exited < 20.0, f"the process took {exited:.1f} s to exit (its group's peer gives up after 30 s)"


def test_shutdown_leaves_no_group_for_the_reaper_to_wait_for():
    """After ``shutdown()`` nothing but the reaper refers to the job's groups, so it destroys them at once:
    a reference cycle that kept them once made every process wait 5 s at exit (an elastic job's hang
    detector then ended its finished workers as hung)."""
    result = run_job("run", "-np", "3", *python_script("shutdown_settles.py"))
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        report = json.loads(result.lines("stdout", rank)[-1])
        assert [cycle["settled"] for cycle in report] == [True, True], report
        assert all(cycle["shutdown_s"] < 1.0 for cycle in report), report
