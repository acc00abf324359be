"""The deadlock watch on a real negotiation table: when every rank is blocked on requests no rank can
complete, rank 0 calls it after the confirmation time, with a diff of where each group waits."""

import time

from torchring.runtime.coordination.deadlock import DeadlockWatch, call_site
from torchring.runtime.coordination.negotiation import Negotiator
from torchring.runtime.requests import OpType, RequestMeta


def _table(size):
    return Negotiator(size, {0: tuple(range(size))}.get)


def _meta(name, op=OpType.ALLREDUCE):
    return RequestMeta(name, op, "float32", (4,), "cpu", 0, seq=0)


def _released(table, watch, name, size):
    for rank in range(size):
        table.record(rank, [_meta(name)])
    watch.released(table.take_ready())


def _confirmed(watch, blocked, quiet=True):
    assert watch.observe(blocked, quiet) is None  # the first sighting only starts the clock
    time.sleep(watch.confirm_s + 0.01)
    return watch.observe(blocked, quiet)


def test_an_extra_allreduce_on_one_rank_is_a_deadlock_that_blames_that_rank():
    table = _table(2)
    watch = DeadlockWatch(table, 0.05, decides=True)
    _released(table, watch, "allreduce.grad", 2)
    table.record(0, [_meta("allreduce.grad")])
    table.record(1, [_meta("allreduce.extra")])
    blocked = [(((0, "allreduce.grad"), "train.py:18"),), (((0, "allreduce.extra"), "train.py:17"),)]
    verdict = _confirmed(watch, blocked)
    assert verdict is not None and verdict.blamed == (1,)  # 'grad' repeats, 'extra' is new
    assert verdict.lines == ("rank 0: waiting in allreduce 'grad' (train.py:18), which rank 1 never submitted",
                             "rank 1: waiting in allreduce 'extra' (train.py:17), which rank 0 never submitted",
                             "last collective every rank took part in: allreduce 'grad'")
    assert "Blamed: rank 1." in verdict.text and "TORCHRING_DEADLOCK_TIMEOUT=0" in verdict.text


def test_the_minority_group_is_blamed_and_the_majority_listed_as_waiting():
    table = _table(3)
    watch = DeadlockWatch(table, 0.05, decides=True)
    for rank in (0, 2):
        table.record(rank, [_meta("barrier.noname.0", OpType.BARRIER)])
    table.record(1, [_meta("reducescatter.noname.13", OpType.REDUCESCATTER)])
    barrier = (((0, "barrier.noname.0"), "test_torch.py:74"),)
    verdict = _confirmed(watch, [barrier, (((0, "reducescatter.noname.13"), "test_torch.py:3639"),), barrier])
    assert verdict.blamed == (1,)
    assert verdict.lines[:2] == (
        "ranks 0,2: waiting in barrier 'noname.0' (test_torch.py:74), which rank 1 never submitted",
        "rank 1: waiting in reducescatter 'noname.13' (test_torch.py:3639), which ranks 0,2 never submitted")


def test_no_verdict_while_a_rank_is_not_blocked_or_the_cycle_moved_or_a_state_changed():
    table = _table(2)
    table.record(0, [_meta("allreduce.a")])
    blocked_0 = (((0, "allreduce.a"), "x.py:1"),)
    watch = DeadlockWatch(table, 0.05, decides=True)
    assert _confirmed(watch, [blocked_0, ()]) is None  # rank 1 computes: it may still submit 'a'
    assert _confirmed(watch, [blocked_0, (((0, "allreduce.b"), "x.py:2"),)], quiet=False) is None
    table.record(1, [_meta("allreduce.b")])
    assert watch.observe([blocked_0, (((0, "allreduce.b"), "x.py:2"),)], True) is None
    assert watch.observe([blocked_0, (((0, "allreduce.b"), "x.py:3"),)], True) is None  # changed: clock restarts
    assert watch.observe([blocked_0, (((0, "allreduce.b"), "x.py:3"),)], True) is None


def test_a_request_no_longer_pending_is_not_a_deadlock():
    table = _table(2)
    watch = DeadlockWatch(table, 0.05, decides=True)
    # both wait on 'a', which every rank submitted: it is on the wire, not stuck in negotiation
    blocked = (((0, "allreduce.a"), "x.py:1"),)
    assert _confirmed(watch, [blocked, blocked]) is None


def test_only_rank_zero_decides_and_zero_turns_it_off():
    table = _table(2)
    table.record(0, [_meta("allreduce.a")])
    table.record(1, [_meta("allreduce.b")])
    blocked = [(((0, "allreduce.a"), ""),), (((0, "allreduce.b"), ""),)]
    assert _confirmed(DeadlockWatch(table, 0.05, decides=False), blocked) is None
    assert not DeadlockWatch(table, 0.0, decides=True).decides


def test_a_blocked_thread_is_announced_until_its_wait_ends():
    watch = DeadlockWatch(_table(2), 5.0, decides=False)
    assert watch.announced() == ()
    watch.note_blocked((0, "allreduce.a"), call_site())
    ((key, where),) = watch.announced()
    assert key == (0, "allreduce.a") and where.startswith("test_deadlock.py:")
    watch.note_unblocked((0, "allreduce.a"))
    assert watch.announced() == ()


def test_a_rank_waiting_in_its_gradient_lane_beside_a_rank_stuck_in_negotiation_is_a_deadlock():
    from torchring.runtime.coordination.deadlock import LANE_SET

    table = _table(2)
    watch = DeadlockWatch(table, 0.05, decides=True)
    table.record(1, [_meta("allreduce.loss")])
    lane = (((LANE_SET, "gradient bucket 'bucket.0.bias'"), "train.py:30"),)
    verdict = _confirmed(watch, [lane, (((0, "allreduce.loss"), "train.py:33"),)])
    assert verdict.blamed == (1,)  # the lane's bucket repeats every step; 'loss' is new
    assert verdict.lines[0] == "rank 0: waiting in DistributedOptimizer's allreduce of gradient bucket " \
                               "'bucket.0.bias' (train.py:30)"
    # every rank in its lane: the data plane is slow or stuck, which is not a divergence
    assert _confirmed(DeadlockWatch(table, 0.05, decides=True), [lane, lane]) is None
