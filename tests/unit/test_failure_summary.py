"""The launcher's failure summary: which ranks failed on their own, the failed rank's stderr once, and
hints for errors it recognises."""

import io
from types import SimpleNamespace

from torchring.launch.supervisor import Failure, Supervisor, Worker, report_failure

TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 1, in <module>',
             "    import horovod.torch as hvd", "ModuleNotFoundError: No module named 'horovod'"]


def _worker(rank, tail=(), shown=True, returncode=1):
    process = SimpleNamespace(poll=lambda: returncode, returncode=returncode, pid=100 + rank)
    relay = SimpleNamespace(tail=list(tail), show=shown)
    return Worker(rank, "localhost", process, (relay, relay))


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
