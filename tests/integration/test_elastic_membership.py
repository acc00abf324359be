"""The elastic driver's membership under races: workers lost, hosts leaving and hosts arriving, in every
order and at random, within one discovery interval or across several.

The driver is the real one (``build_elastic_driver``, as ``torchring run`` builds it): its store, its
spawner starting real processes, its discovery script reading a file. The "hosts" are this machine's
loopback addresses (127.0.0.2, ...), each with one slot; the workers are ``sleep`` processes and the
test plays their side of the protocol the way ``hvd.init()`` and a training step do: a member arrives in
its generation, rank 0 marks the first step once all have arrived, a spare says it stands by. After
the events, the driver must settle on a generation that trains (every member running and arrived, as
many as the pool allows up to --max-np), or wait for hosts when fewer than --min-np are left.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import time

import pytest

from torchring.contract import elastic_arrived_key, elastic_first_step_key, elastic_standby_key
from torchring.launch.cli.arguments import add_run_arguments, config_from_args
from torchring.launch.job import build_elastic_driver

HOSTS = [f"127.0.0.{number}" for number in range(2, 9)]


class Job:
    """A driver over a pool file, stepped by hand."""

    def __init__(self, tmp_path, hosts, *flags: str) -> None:
        self.pool_file = tmp_path / "pool"
        self.pool = list(hosts)
        self._write_pool()
        parser = argparse.ArgumentParser()
        add_run_arguments(parser)
        config = config_from_args(parser.parse_args(["--host-discovery-script", f"cat {self.pool_file}",
                                                     "--hang-timeout", "0", *flags, "sleep", "600"]))
        self.min_np, self.max_np, self.spares = config.elastic.min_np, config.elastic.max_np, config.elastic.spares
        self.driver, self.job = build_elastic_driver(config)
        object.__setattr__(self.driver.settings, "discovery_interval_s", 0.0)  # every pass asks discovery
        self.logs: list[str] = []
        self.driver.log = self.driver.hosts.log = self.logs.append

    def _write_pool(self) -> None:
        self.pool_file.write_text("".join(f"{host}\n" for host in self.pool))

    def close(self) -> None:
        self.driver.close()
        self.job.close()

    # ---- the events ---------------------------------------------------------------------------
    def kill(self, host: str, wait: bool = True) -> None:
        """SIGKILL the running workers on ``host`` (as a crash or the OOM killer would)."""
        for worker in self.driver.live:
            if worker.host == host and worker.running:
                os.kill(worker.process.pid, signal.SIGKILL)
                if wait:
                    os.waitid(os.P_PID, worker.process.pid, os.WEXITED | os.WNOWAIT)

    def remove(self, host: str) -> None:
        self.pool = [h for h in self.pool if h != host]
        self._write_pool()

    def add(self, host: str) -> None:
        if host not in self.pool:
            self.pool.append(host)
            self._write_pool()

    # ---- the workers' side --------------------------------------------------------------------
    def play_workers(self) -> None:
        """Running members arrive in the current generation; rank 0's first step once all are in; spares
        stand by."""
        driver, store = self.driver, self.driver.server.auth
        by_id = {worker.worker_id: worker for worker in driver.workers}
        members = driver.members
        if driver.generation >= 0 and all(by_id[wid].running for wid in members):
            for rank in members.values():
                store.set(elastic_arrived_key(driver.generation, rank), "1")
            store.set(elastic_first_step_key(driver.generation), "1")
        for worker in driver.live:
            if worker.spare:
                store.set(elastic_standby_key(worker.worker_id), "1")

    def step(self) -> None:
        assert self.driver.step() is None, self.logs[-5:]
        self.play_workers()

    def settle(self, timeout: float = 30.0) -> None:
        """Step until nothing changes for a while: the same generation, no process left to reap."""
        deadline = time.monotonic() + timeout
        quiet, last = 0, None
        while quiet < 10:
            assert time.monotonic() < deadline, "the driver never settled:\n" + "\n".join(self.logs[-10:])
            self.step()
            state = (self.driver.generation, len(self.driver.live), self.driver.waiting_for_hosts)
            reaped = all(w.running or w.process.poll() is None for w in self.driver.live)
            quiet = quiet + 1 if state == last and reaped else 0
            last = state
            time.sleep(0.01)

    # ---- what must hold -----------------------------------------------------------------------
    def check(self) -> None:
        """A generation that trains, as large as the pool allows; or a wait for hosts below the minimum."""
        driver = self.driver
        usable = [host for host in self.pool if not driver.blacklist.blocks(host)]
        expected = min(self.max_np, len(usable))
        history = "\n".join(self.logs)
        live = driver.live
        assert all(w.host in usable for w in live), f"a worker outlived its host's removal:\n{history}"
        slots = [(w.host, w.slot) for w in live]
        assert len(slots) == len(set(slots)), f"two workers on one slot:\n{history}"
        if expected < self.min_np:
            assert driver.waiting_for_hosts, f"{len(usable)} usable hosts, yet not waiting:\n{history}"
            return
        assert not driver.waiting_for_hosts, history
        by_id = {worker.worker_id: worker for worker in driver.workers}
        members = driver.members
        assert len(members) == expected, f"generation of {len(members)}, expected {expected}:\n{history}"
        assert all(by_id[wid].running for wid in members), f"a member is not running:\n{history}"
        assert sorted(members.values()) == list(range(expected))
        store = driver.server.auth
        assert all(store.get(elastic_arrived_key(driver.generation, rank)) for rank in members.values())
        spares = [w for w in live if w.spare and w.running]
        assert len(spares) == min(self.spares, len(usable) - expected), f"spares {spares}:\n{history}"
        assert {w.worker_id for w in live if w.running} == set(members) | {w.worker_id for w in spares}


@pytest.fixture
def job_factory(tmp_path):
    jobs = []

    def make(hosts, *flags):
        job = Job(tmp_path, hosts, *flags)
        jobs.append(job)
        job.settle()
        job.check()
        return job

    yield make
    for job in jobs:
        job.close()


EVENTS = {"kill": lambda job: job.kill(HOSTS[2]), "remove": lambda job: job.remove(HOSTS[2]),
          "add": lambda job: job.add(HOSTS[3])}


@pytest.mark.parametrize("order", list(itertools.permutations(EVENTS)), ids="-".join)
@pytest.mark.parametrize("passes_between", [0, 1, 3])
def test_a_lost_worker_its_host_removed_and_a_host_added_in_every_order(job_factory, order, passes_between):
    """The issue's host loss (a worker killed and its host removed) with a host arriving, every order,
    with 0 (one discovery interval), 1 or 3 driver passes between the events."""
    job = job_factory(HOSTS[:3], "--min-np", "2", "--max-np", "3")
    for index, name in enumerate(order):
        EVENTS[name](job)
        if index < len(order) - 1:
            for _ in range(passes_between):
                job.step()
    job.settle()
    job.check()
    assert len(job.driver.members) == 3 and all(w.host != HOSTS[2] for w in job.driver.live)


@pytest.mark.parametrize("kill_first", [True, False], ids=["kill-then-remove", "remove-then-kill"])
def test_a_lost_host_ends_in_a_generation_of_the_survivors(job_factory, kill_first):
    job = job_factory(HOSTS[:3], "--min-np", "2", "--max-np", "3")
    events = [lambda: job.kill(HOSTS[2]), lambda: job.remove(HOSTS[2])]
    for event in events if kill_first else reversed(events):
        event()
        job.step()
    job.settle()
    job.check()
    assert len(job.driver.members) == 2


@pytest.mark.parametrize("seed", range(12))
def test_random_losses_removals_and_additions(job_factory, seed):
    """Random sequences of kills (not waited for: the driver may see them late), removals and additions
    over seven hosts, random passes between; a spare kept where a slot is free."""
    rng = random.Random(seed)
    job = job_factory(HOSTS[:4], "--min-np", "2", "--max-np", "3", "--spares", "1")
    for _ in range(rng.randint(3, 8)):
        event = rng.choice(["kill", "kill", "remove", "add"])
        host = rng.choice(HOSTS)
        if event == "kill":
            job.kill(host, wait=rng.random() < 0.5)
        elif event == "remove":
            job.remove(host)
        else:
            job.add(host)
        for _ in range(rng.choice([0, 0, 1, 2])):
            job.step()
    job.settle()
    job.check()


def test_below_the_minimum_the_job_waits_and_continues_when_a_host_returns(job_factory):
    job = job_factory(HOSTS[:3], "--min-np", "2", "--max-np", "3")
    for host in HOSTS[1:3]:
        job.kill(host)
        job.remove(host)
    job.settle()
    job.check()
    assert job.driver.waiting_for_hosts and any("waiting up to 600 s for hosts (need 2)" in line for line in job.logs)
    job.add(HOSTS[1])
    job.settle()
    job.check()
    assert len(job.driver.members) == 2 and any("enough hosts again after" in line for line in job.logs)


def test_a_spare_takes_a_lost_workers_place_and_a_lost_spare_is_replaced(job_factory):
    job = job_factory(HOSTS[:4], "--min-np", "2", "--max-np", "3", "--spares", "1")
    (spare,) = [w for w in job.driver.live if w.spare]
    victim = next(w for w in job.driver.live if not w.spare)
    job.kill(victim.host)
    job.settle()
    job.check()
    assert spare.worker_id in job.driver.members and not spare.spare
    assert any(f"spare {spare.worker_id} on {spare.host} took a place" in line for line in job.logs)
    resets = job.driver.resets
    (new_spare,) = [w for w in job.driver.live if w.spare]
    job.kill(new_spare.host)
    job.settle()
    job.check()
    assert job.driver.resets == resets, "a lost spare is not a membership change"
    assert any(f"hot spare {new_spare.worker_id} on {new_spare.host} was killed by signal 9" in line
               for line in job.logs)
