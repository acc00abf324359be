"""A failed engine's alarm in a real TCPStore (``runtime.coordination.failure_alarm``): posted signed and
read back naming the rank, a forged one ignored, and a real Gloo collective that waits on a peer that
never comes ended by a posted alarm within a slice, while one that is only late still completes."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.gloo_pair import two_rank_groups
from tests.ports import free_port
from torchring.exceptions import HorovodInternalError
from torchring.runtime.coordination.failure_alarm import CHECK_EVERY_S, FailureAlarm, wait_unless_alarmed
from torchring.store_auth import AuthenticatedStore, JobCredentials

TIMEOUT = timedelta(seconds=20)


@pytest.fixture
def stores():
    """The job's signed store as two ranks see it (each its own client) and the server."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    credentials = JobCredentials.new()
    clients = [dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT) for _ in range(2)]
    yield port, server, [AuthenticatedStore(client, credentials) for client in clients]


def test_a_posted_failure_is_read_by_another_rank_with_its_rank_and_error(stores) -> None:
    _, _, (rank0, rank1) = stores
    failed, waiting = FailureAlarm(rank0, "gen3"), FailureAlarm(rank1, "gen3")
    assert waiting.posted() is None and not waiting.seen
    failed.post(0, "Connection closed by peer [127.0.0.1]:7886\x1b[0m")
    _until_visible(rank1, "gen3/engine-failed")
    text = waiting.posted()
    assert text is not None, _why_unread(rank1, "gen3/engine-failed")
    assert text.startswith("rank 0's engine failed (Connection closed by peer [127.0.0.1]:7886?[0m)")
    assert waiting.seen
    waiting.post(1, "rank 0's engine failed (...)")  # its own failure, caused by the alarm: not posted over it
    assert "rank 0's engine failed (Connection closed" in (FailureAlarm(rank0, "gen3").posted() or "")
    assert FailureAlarm(rank1, "gen4").posted() is None  # another generation's alarm


def test_a_forged_alarm_is_ignored(stores) -> None:
    _, server, (_, rank1) = stores
    server.set("gen3/engine-failed", json.dumps({"rank": 2, "text": "stop"}))  # no job signature
    _until_visible(rank1, "gen3/engine-failed")
    warnings = _Warnings()
    logger = logging.getLogger("torchring")
    level = logger.level
    logger.addHandler(warnings)  # on the logger itself: whether it propagates to pytest's handler does not matter
    logger.setLevel(logging.WARNING)
    try:
        assert FailureAlarm(rank1, "gen3").posted() is None
    finally:
        logger.removeHandler(warnings)
        logger.setLevel(level)
    assert rank1.rejected == {"gen3/engine-failed"}, _why_unread(rank1, "gen3/engine-failed")  # read and refused
    state = f"level {level}, disabled {logger.disabled}, logging.disable {logging.root.manager.disable}"
    assert any("not signed with the job's secret" in line for line in warnings.lines), state


def _until_visible(store: AuthenticatedStore, key: str) -> None:
    """Wait until this client sees ``key``: a TCPStore ``set`` is not answered, so another client's next
    request can reach the server before it (a read right after it missed the value 1 time in 8 under load)."""
    store.raw.wait([key], TIMEOUT)


def _why_unread(store: AuthenticatedStore, key: str) -> str:
    """What this client's store says of ``key`` now (``FailureAlarm.posted`` turns a store error into None)."""
    try:
        return f"the key exists: {store.raw.check([key])}; its raw value: {store.raw.get(key)[:80]!r}"
    except Exception as error:  # noqa: BLE001 - the error is the answer
        return f"the store failed: {error!r}"


class _Warnings(logging.Handler):
    """The messages of the records it is given."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_posted_alarm_ends_a_wait_on_a_peer_that_never_comes(stores) -> None:
    port, _, (rank0, rank1) = stores
    groups = two_rank_groups(port, TIMEOUT)
    tensors = [torch.ones(4), torch.ones(4)]
    work = groups[0].allreduce([tensors[0]])  # rank 1 does not take part (yet)
    poster = threading.Timer(0.3, lambda: FailureAlarm(rank1, "gen1").post(1, "peer lost"))
    poster.start()
    started = time.monotonic()
    with pytest.raises(HorovodInternalError, match=r"rank 1's engine failed \(peer lost\)"):
        wait_unless_alarmed(work, FailureAlarm(rank0, "gen1"))
    assert time.monotonic() - started < 0.3 + 2 * CHECK_EVERY_S + 2
    groups[1].allreduce([tensors[1]]).wait()  # the collective ends, so that the groups can go
    work.wait()


def test_a_collective_that_is_only_late_completes_through_the_slices(stores) -> None:
    port, _, (rank0, _) = stores
    groups = two_rank_groups(port, TIMEOUT)
    tensors = [torch.ones(4), torch.ones(4)]
    late = threading.Thread(target=lambda: (time.sleep(1.5 * CHECK_EVERY_S), groups[1].allreduce([tensors[1]]).wait()))
    late.start()
    wait_unless_alarmed(groups[0].allreduce([tensors[0]]), FailureAlarm(rank0, "gen1"))
    late.join()
    assert tensors[0].tolist() == [2.0] * 4


class _CompletedJustAfterTheSlice:
    """A work whose timed wait ran out just before it completed, as c10d's ``Work.wait(timeout)`` can."""

    def __init__(self) -> None:
        self.untimed_waits = 0

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is not None:
            raise RuntimeError("Operation timed out!")
        self.untimed_waits += 1
        return True

    def is_completed(self) -> bool:
        return True


def test_a_work_that_completes_as_a_slice_runs_out_is_not_taken_for_a_failure(stores) -> None:
    _, _, (rank0, _) = stores
    work = _CompletedJustAfterTheSlice()
    wait_unless_alarmed(work, FailureAlarm(rank0, "gen1"))  # it raised 'Operation timed out!' before
    assert work.untimed_waits == 1
