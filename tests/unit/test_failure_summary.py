"""The launcher's failure summary: which ranks failed on their own, the failed rank's stderr once, and
hints for errors it recognises."""

import io
from types import SimpleNamespace

from torchring.launch.spawn.rank_env import Placement
from torchring.launch.spawn.worker import ProcessName, Worker
from torchring.launch.supervisor import Failure, Supervisor, report_failure

TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 1, in <module>',
             "    import horovod.torch as hvd", "ModuleNotFoundError: No module named 'horovod'"]


def _worker(rank, tail=(), shown=True, returncode=1):
    process = SimpleNamespace(poll=lambda: returncode, returncode=returncode, pid=100 + rank)
    relay = SimpleNamespace(tail=list(tail), show=shown)
    return Worker(ProcessName("rank", rank), "localhost", Placement.LOCAL, process, (relay, relay))


def _summary(failure, workers):
    stream = io.StringIO()
    report_failure(failure, workers, stream)
    return stream.getvalue()


def test_two_ranks_that_fail_on_their_own_are_not_each_others_consequence():
    workers = [_worker(0), _worker(1), _worker(2, returncode=0)]
    supervisor = Supervisor(settle_period_s=0)
    for worker in workers:
        supervisor.add(worker)
    failure = supervisor._root_cause(workers[:2])
    assert failure.consequences == [] and failure.independent == [(1, "exited with code 1")]
    text = _summary(failure, workers)
    assert "consequence" not in text and "rank 1 exited with code 1 too, on its own" in text


def test_a_rank_that_recorded_a_failed_peer_is_a_consequence():
    workers = [_worker(0), _worker(1)]
    supervisor = Supervisor(settle_period_s=0, peer_failure=lambda rank: "rank 0 failed" if rank == 1 else None)
    for worker in workers:
        supervisor.add(worker)
    failure = supervisor._root_cause(workers)
    assert failure.rank == 0 and failure.consequences == [(1, "exited with code 1", "rank 0 failed")]
    assert "rank 1 exited with code 1 as a consequence (rank 0 failed)" in _summary(failure, workers)


def test_a_traceback_the_console_showed_is_not_repeated():
    workers = [_worker(0, TRACEBACK), _worker(1)]
    text = _summary(Failure(0, "localhost", 100, 1, "exited with code 1"), workers)
    assert "Traceback" not in text and "    import horovod.torch" not in text
    assert "its last line: ModuleNotFoundError: No module named 'horovod'" in text


def test_a_traceback_hidden_by_ranks_is_shown_in_the_summary():
    workers = [_worker(0, TRACEBACK, shown=False), _worker(1)]
    text = _summary(Failure(0, "localhost", 100, 1, "exited with code 1"), workers)
    assert text.count("Traceback") == 1 and "    import horovod.torch as hvd" in text


def test_a_missing_horovod_module_suggests_horovod_compat():
    text = _summary(Failure(0, "localhost", 100, 1, "exited with code 1"), [_worker(0, TRACEBACK)])
    assert "hint:" in text and "--horovod-compat" in text and "horovodrun" in text


def test_nccl_on_a_cpu_build_says_why_and_that_gloo_works():
    tail = ["RuntimeError: Distributed package doesn't have NCCL built in"]
    text = _summary(Failure(0, "localhost", 100, 1, "exited with code 1"), [_worker(0, tail)])
    assert "CPU build" in text and "'gloo'" in text


def _supervised(workers, **kwargs):
    supervisor = Supervisor(settle_period_s=5, poll_interval_s=0.01, **kwargs)
    for worker in workers:
        supervisor.add(worker)
    return supervisor


def test_the_rank_that_raised_is_the_cause_even_while_the_rank_that_saw_it_leave_exits_first():
    from torchring.rank_failure import OwnFailure

    workers = [_worker(0), _worker(1, returncode=None)]  # rank 1 is still exiting
    own = {1: OwnFailure(100.0, "ValueError: bad batch", "train.py:31")}
    supervisor = _supervised(workers, own_failure=own.get,
                             peer_failure=lambda rank: "gradient allreduce failed" if rank == 0 else None)
    failure = supervisor._root_cause([workers[0]])
    assert failure.rank == 1 and failure.exit_code == 1
    assert failure.reason == "raised ValueError: bad batch (train.py:31) and was still exiting"
    assert failure.consequences == [(0, "exited with code 1", "gradient allreduce failed")]


def test_a_rank_that_aborted_in_its_teardown_after_a_peer_raised_is_a_consequence():
    from torchring.rank_failure import OwnFailure

    workers = [_worker(0, returncode=-6), _worker(1)]
    supervisor = _supervised(workers, own_failure={1: OwnFailure(5.0, "KeyError: 'label'", "train.py:9")}.get)
    failure = supervisor._root_cause(workers)
    assert failure.rank == 1 and failure.independent == []
    assert failure.consequences == [(0, "was killed by signal 6 (SIGABRT)", "it ended after rank 1's error")]


def test_the_earliest_own_failure_is_the_cause_and_a_different_later_one_is_independent():
    from torchring.rank_failure import OwnFailure

    workers = [_worker(0), _worker(1), _worker(2)]
    own = {0: OwnFailure(7.0, "KeyError: 'x'", "a.py:1"), 2: OwnFailure(3.0, "ValueError: y", "b.py:2")}
    failure = _supervised(workers, own_failure=own.get)._root_cause(workers)
    assert failure.rank == 2
    assert failure.independent == [(0, "exited with code 1 after it raised KeyError: 'x' (a.py:1)")]
    assert failure.consequences == [(1, "exited with code 1", "it ended after rank 2's error")]


def test_an_unexplained_failure_waits_only_briefly_for_another_ranks_record():
    import time

    workers = [_worker(0, returncode=-9), _worker(1, returncode=None)]
    supervisor = _supervised(workers, cause_wait_s=0.2)
    started = time.monotonic()
    failure = supervisor._root_cause([workers[0]])
    assert failure.rank == 0 and 0.2 <= time.monotonic() - started < 2


def test_a_deadlock_the_engines_confirmed_blames_the_odd_rank_and_prints_the_diff():
    from torchring.launch.rendezvous import DeadlockRecord

    workers = [_worker(0), _worker(1), _worker(2)]
    record = DeadlockRecord((1,), ("ranks 0,2: waiting in barrier 'noname.0' (t.py:74)", "rank 1: waiting in x"))
    failure = _supervised(workers, deadlock=lambda: record)._root_cause(workers)
    assert failure.rank == 1 and "diverged from the other ranks" in failure.reason
    assert failure.consequences == [(0, "exited with code 1", "it waited for rank 1"),
                                    (2, "exited with code 1", "it waited for rank 1")]
    text = _summary(failure, workers)
    assert "torchring run:   ranks 0,2: waiting in barrier 'noname.0' (t.py:74)\n" in text
    assert text.index("waiting in barrier") < text.index("torchring run: rank 1 (pid 101")


def test_a_long_cause_is_cut_to_its_first_line():
    workers = [_worker(0), _worker(1)]
    failure = Failure(0, "localhost", 100, 1, "exited with code 1",
                      consequences=[(1, "exited with code 1", "x" * 300 + "\nmore")])
    text = _summary(failure, workers)
    assert "(" + "x" * 199 + "…)" in text and "more" not in text
