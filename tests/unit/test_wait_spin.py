"""Blocking waits poll for their result for ``TORCHRING_WAIT_SPIN_US`` before they sleep, only while the
host has a CPU for each of its ranks (``wake_probe.wait_spin_seconds``); unset, only where this host wakes
sleeping threads slowly (``wake_probe``)."""

from __future__ import annotations

import os
import threading
import time

import torch

from torchring.runtime import wake_probe
from torchring.runtime.requests import OpType, Request, RequestMeta
from torchring.runtime.wake_probe import wait_spin_seconds
from torchring.settings import Settings


def _request() -> Request:
    return Request(RequestMeta("allreduce.x", OpType.ALLREDUCE), torch.zeros(1))


def test_polling_sees_a_result_completed_by_another_thread() -> None:
    request = _request()
    completer = threading.Timer(0.01, request.complete, args=("done",))
    completer.start()
    assert request.spin_until_done(time.perf_counter() + 10.0)
    assert request.wait() == "done"
    completer.join()


def test_polling_gives_up_at_its_deadline_and_the_request_stays_pending() -> None:
    request = _request()
    started = time.perf_counter()
    assert not request.spin_until_done(started + 0.005)
    assert time.perf_counter() - started >= 0.005
    assert not request.done()
    request.complete("late")
    assert request.wait_done(0.0)


def test_waits_poll_only_while_the_host_has_a_cpu_for_each_rank() -> None:
    cpus = len(os.sched_getaffinity(0))
    settings = Settings(wait_spin_us=1500.0)
    assert wait_spin_seconds(settings, cpus) == 0.0015
    assert wait_spin_seconds(settings, cpus + 1) == 0.0
    assert wait_spin_seconds(Settings(wait_spin_us=0.0), 1) == 0.0


def test_unset_the_poll_follows_how_late_this_host_wakes_a_sleeping_thread() -> None:
    assert Settings.from_env({}).wait_spin_us is None
    assert wait_spin_seconds(Settings(), 1) is None  # decided by the probe init() starts
    assert wait_spin_seconds(Settings(wait_spin_us=0.0), 1) == 0.0  # a value given is used as it is
    assert wait_spin_seconds(Settings(wait_spin_us=800.0), 1) == 800.0 * 1e-6
    assert wait_spin_seconds(Settings(), len(os.sched_getaffinity(0)) + 1) == 0.0
    assert wake_probe.spin_for(60e-6) == wake_probe.AUTO_SPIN_S  # a host whose idle CPUs halt
    assert wake_probe.spin_for(5e-6) == 0.0


def test_the_wake_up_probe_measures_a_real_hand_off_and_init_runs_it_on_a_thread_of_its_own() -> None:
    started = time.perf_counter()
    delay = wake_probe.thread_wakeup_seconds()
    assert 0.0 < delay < 0.05
    assert time.perf_counter() - started >= 12 * 0.001  # it paused before each of its hand-offs
    wake_probe.start()
    wake_probe.start()  # once per process
    deadline = time.monotonic() + 10
    while wake_probe.measured_wakeup_seconds() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert wake_probe.auto_spin_seconds() == wake_probe.spin_for(wake_probe.measured_wakeup_seconds())
