"""``group_reaper``: a retired object is destroyed on the reaper thread, once nothing else refers to it."""

from __future__ import annotations

import threading

from torchring.runtime import group_reaper


class _Group:
    """Stands in for a process group: records which thread destroyed it."""

    def __init__(self, destroyed_by: list[str]) -> None:
        self._destroyed_by = destroyed_by

    def __del__(self) -> None:
        self._destroyed_by.append(threading.current_thread().name)


def test_a_retired_group_is_destroyed_on_the_reaper_thread_once_its_last_other_reference_goes():
    destroyed_by: list[str] = []
    group = _Group(destroyed_by)
    kept_elsewhere = [group]  # as a traceback's frame would
    group_reaper.retire(group)
    del group
    assert group_reaper.settle(0.05) is False and destroyed_by == []
    kept_elsewhere.clear()  # freed here, but the reaper still holds it: not destroyed on this thread
    assert destroyed_by == []
    assert group_reaper.settle(5.0) is True
    assert destroyed_by == ["torchring-group-reaper"]


def test_settle_returns_at_once_when_nothing_is_held():
    assert group_reaper.settle(5.0) is True


class _FailingWork(_Group):
    """Stands in for a collective's ``Work`` whose peer was lost."""

    def wait(self) -> None:
        raise RuntimeError("Connection closed by peer")


def _wait_for(work: _FailingWork) -> None:
    with group_reaper.retire_on_failure(work):
        work.wait()


def test_a_work_whose_wait_raised_is_destroyed_on_the_reaper_thread_once_the_error_goes():
    destroyed_by: list[str] = []
    failures: list[BaseException] = []
    try:
        _wait_for(_FailingWork(destroyed_by))
    except RuntimeError as error:
        failures.append(error)  # its traceback's frames refer to the work, as an engine's failure does
    assert destroyed_by == []
    failures.clear()  # the last other reference goes here: the reaper destroys the work
    assert group_reaper.settle(5.0) is True
    assert destroyed_by == ["torchring-group-reaper"]


def test_a_work_whose_wait_succeeded_is_not_retired():
    destroyed_by: list[str] = []
    work = _Group(destroyed_by)
    with group_reaper.retire_on_failure(work):
        pass
    del work
    assert destroyed_by == [threading.current_thread().name]
