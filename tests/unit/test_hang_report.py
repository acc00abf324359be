"""The hang report on real ``faulthandler`` text: parsing, where each rank is, grouping and blame.

The files under data/ are rank dumps a real ``torchring run --hang-timeout 4`` job wrote (the scripts
tests/integration/scripts/hang_ddp.py and hang_hvd.py); one more dump comes from a real subprocess that
loads the launcher's stack hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchring.contract import STACK_FILE, STACK_FILE_HEADER
from torchring.launch.spawn.spawner import STACK_HOOK_PATH
from torchring.launch.watch.hang_detector import sampling_interval
from torchring.launch.watch.hang_report import (
    RankSample,
    blame,
    format_report,
    group_ranks,
    location,
    main_thread,
    parse_dump,
    waiting_in_collective,
)

DATA = Path(__file__).resolve().parent / "data"
DDP_WAITING = (DATA / "stacks_ddp_waiting_in_all_reduce.txt").read_text()
DDP_STUCK = (DATA / "stacks_ddp_stuck_in_load_batch.txt").read_text()
HOROVOD_WAITING = (DATA / "stacks_horovod_waiting_in_allreduce.txt").read_text()

SLEEPER = """
import threading, time
def helper():
    time.sleep(60)
def load_batch():
    print("ready", flush=True); time.sleep(60)  # one line: a dump taken once "ready" arrives shows it
threading.Thread(target=helper, daemon=True).start()
load_batch()
"""


def _running(rank: int, text: str) -> RankSample:
    return RankSample(rank, 100 + rank, "running", parse_dump(text), text, unchanged_s=5.0)


@pytest.fixture(scope="module")
def hooked_dump(tmp_path_factory) -> str:
    """The dump a real Python process writes on SIGUSR2 once the stack hook (and a user's own
    sitecustomize, which must still load) is on its path."""
    directory = tmp_path_factory.mktemp("hook")
    (directory / "user").mkdir()
    (directory / "user" / "sitecustomize.py").write_text("print('user sitecustomize', flush=True)\n")
    stacks = directory / "stacks"
    env = {**os.environ, STACK_FILE: str(stacks),
           "PYTHONPATH": os.pathsep.join([str(STACK_HOOK_PATH), str(directory / "user")])}
    process = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "user sitecustomize\n"
        assert process.stdout.readline() == "ready\n"
        os.kill(process.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while "in <module>" not in stacks.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        process.kill()
        process.wait()
    text = stacks.read_text()
    header, _, dump = text.partition("\n")
    assert header == f"{STACK_FILE_HEADER}{process.pid}"
    return dump


def test_the_stack_hook_dumps_every_thread_and_the_main_thread_is_the_scripts(hooked_dump):
    threads = parse_dump(hooked_dump)
    assert len(threads) == 2
    main = main_thread(threads)
    assert [f.function for f in main.frames] == ["load_batch", "<module>"]
    assert main.frames[0].line == 6
    assert location(_running(1, hooked_dump)) == "in load_batch (<string>:6)"


def test_a_rank_in_torch_distributed_or_torchring_waits_in_a_collective():
    assert waiting_in_collective(parse_dump(DDP_WAITING))
    assert waiting_in_collective(parse_dump(HOROVOD_WAITING))
    assert not waiting_in_collective(parse_dump(DDP_STUCK))
    assert location(_running(0, DDP_WAITING)) == "waiting in all_reduce (hang_ddp.py:28)"
    assert location(_running(0, HOROVOD_WAITING)) == "waiting in allreduce (hang_hvd.py:14)"
    assert location(_running(1, DDP_STUCK)) == "in load_batch (hang_ddp.py:17)"


def test_the_rank_outside_any_collective_is_blamed_and_named_the_odd_one_out():
    samples = [_running(0, DDP_WAITING), _running(1, DDP_STUCK), _running(2, DDP_WAITING)]
    assert [[s.rank for s in group] for group in group_ranks(samples)] == [[0, 2], [1]]
    assert blame(samples) == [1]
    lines, full = format_report(samples, "hung:")
    assert lines[1] == "ranks 0,2: waiting in all_reduce (hang_ddp.py:28); stack unchanged for 5 s"
    assert "rank 1: in load_batch (hang_ddp.py:17); stack unchanged for 5 s — the odd one out" in lines
    assert lines[-1] == "blamed: rank 1"
    assert "==== rank 1 (running, pid 101) ====" in full and DDP_STUCK.strip() in full


def test_frozen_ranks_are_blamed_before_any_stack():
    frozen = RankSample(1, 101, "frozen", parse_dump(DDP_STUCK), DDP_STUCK, 7.0, "T, stopped", sampled_ago_s=9.0)
    samples = [_running(0, DDP_WAITING), frozen]
    assert blame(samples) == [1]
    lines, _ = format_report(samples, "hung:")
    assert "rank 1: frozen (process state T, stopped) for 7 s — the odd one out" in lines
    assert "  its last stack, sampled 9 s ago:" in lines


def test_when_every_rank_waits_the_smallest_group_is_blamed_and_one_group_blames_nobody():
    assert blame([_running(0, DDP_WAITING), _running(1, HOROVOD_WAITING), _running(2, DDP_WAITING)]) == [1]
    assert blame([_running(0, DDP_WAITING), _running(1, DDP_WAITING)]) == []


def test_unknown_lines_are_skipped_and_the_interval_is_a_clamped_tenth():
    assert parse_dump("garbage\n\n") == ()
    assert sampling_interval(4) == 1 and sampling_interval(120) == 12 and sampling_interval(3000) == 30


def _thread(ident, *frames):
    from torchring.launch.watch.hang_report import Frame, ThreadStack

    return ThreadStack(ident, False, tuple(Frame(f, line, fn) for f, line, fn in frames))


def test_a_wait_loop_inside_torchring_is_not_progress_but_the_scripts_own_frames_are():
    from torchring.launch.watch.hang_report import progress_signature

    site = "/venv/lib/python3.12/site-packages"
    user = ("/job/train.py", 30, "<module>")

    def rank(wait_line, engine_line, user_frame=user):
        main = _thread("0x1", (f"{site}/torchring/runtime/requests.py", wait_line, "wait_done"),
                       (f"{site}/torchring/runtime/submit.py", 231, "synchronize"), user_frame)
        engine = _thread("0x2", ("/usr/lib/python3.12/threading.py", 355, "wait"),
                         (f"{site}/torchring/runtime/engine.py", engine_line, "_wait_for_cycle"),
                         ("/usr/lib/python3.12/threading.py", 1012, "run"))
        recorder = _thread("0x3", ("/job/helpers.py", 5, "load"), ("/usr/lib/python3.12/threading.py", 1012, "run"))
        return (main, engine, recorder)

    assert progress_signature(rank(80, 270)) == progress_signature(rank(84, 301))
    assert progress_signature(rank(80, 270)) != progress_signature(rank(80, 270, ("/job/train.py", 31, "<module>")))
    # a thread of the script's own waiting on an Event stays as it is
    own_wait = _thread("0x4", ("/usr/lib/python3.12/threading.py", 355, "wait"), ("/job/train.py", 8, "worker"))
    assert progress_signature((own_wait,))[0] == own_wait.frames


def test_the_summary_says_divergence_when_every_rank_waits_in_a_different_collective():
    from torchring.launch.watch.hang_report import Frame, ThreadStack, hang_reason

    def waiting(rank, line, function):
        frames = (Frame("/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", 2500, function),
                  Frame("/job/train.py", line, "<module>"))
        return RankSample(rank, 100 + rank, "running", (ThreadStack("0x1", True, frames),))

    samples = [waiting(0, 28, "all_reduce"), waiting(1, 35, "barrier"), waiting(2, 28, "all_reduce")]
    assert blame(samples) == [1]
    reason = hang_reason(samples, [1], "no rank made progress for 5 s")
    assert reason.startswith("probably diverged from the other ranks: it is waiting in barrier (train.py:35), "
                             "while ranks 0,2 are waiting in all_reduce (train.py:28)")
    same = [waiting(0, 28, "all_reduce"), waiting(1, 28, "all_reduce")]
    assert hang_reason(same, [0, 1], "x").startswith("waited in a collective that never completed, as every rank did")
