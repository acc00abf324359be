"""The elastic launcher's recovery clock and its host pool: what they count and when, without a job."""

from __future__ import annotations

import pytest

from torchring.contract import elastic_first_step_key
from torchring.launch.elastic.discovery import Blacklist, HostDiscovery
from torchring.launch.elastic.host_pool import HostPool
from torchring.launch.elastic.plan import WorkerView, plan_membership
from torchring.launch.elastic.recovery import QUIET_WINDOW_S, RecoveryClock


class Store:
    """A dict with the signed store's get (the clock only reads)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, key: str, max_bytes: int = 0) -> bytes | None:
        return self.values.get(key)


def test_a_recovery_is_timed_from_the_first_change_seen_to_the_first_step_of_the_generation_published():
    now = [100.0]
    clock, store = RecoveryClock(clock=lambda: now[0]), Store()
    clock.seen("worker_lost")
    now[0] = 101.0
    clock.published(1, 3)
    now[0] = 101.5
    clock.seen("host_lost")  # before training resumed: the same recovery, now a host loss
    clock.published(2, 2)
    assert clock.waiting and clock.poll(store) is None
    store.values[elastic_first_step_key(1)] = b"1"  # generation 1 never trained: it does not end it
    assert clock.poll(store) is None
    now[0] = 103.0
    store.values[elastic_first_step_key(2)] = b"1"
    assert clock.poll(store) == "generation 2 trained its first step 3.0 s after the host lost was seen"
    assert not clock.waiting and clock.count == {"host_lost": 1} and clock.last_s == {"host_lost": 3.0}
    page = {family.name: family for family in clock.families()}
    samples = {(s.name, tuple(s.labels.items())): s.value for s in page["torchring_elastic_recovery_seconds"].samples}
    assert samples[("torchring_elastic_recovery_seconds_count", (("cause", "host_lost"),))] == 1
    assert samples[("torchring_elastic_recovery_seconds_sum", (("cause", "host_lost"),))] == 3.0
    assert samples[("torchring_elastic_recovery_seconds_count", (("cause", "worker_lost"),))] == 0
    with pytest.raises(ValueError):
        clock.seen("cosmic_ray")


def test_background_work_waits_for_a_recovery_at_most_the_quiet_window():
    now = [0.0]
    clock = RecoveryClock(clock=lambda: now[0])
    assert clock.quiet()
    clock.seen("worker_lost")
    assert not clock.quiet()  # seen, not yet published
    clock.published(1, 3)
    now[0] = QUIET_WINDOW_S / 2
    assert not clock.quiet()
    now[0] = QUIET_WINDOW_S + 1
    assert clock.quiet()


def test_a_host_discovery_drops_and_lists_again_comes_off_the_blacklist(tmp_path):
    pool = tmp_path / "pool"
    pool.write_text("localhost\n127.0.0.2\n")
    logs: list[str] = []
    blacklist = Blacklist()
    hosts = HostPool(HostDiscovery(script=f"cat {pool}"), blacklist, lambda host: [], logs.append)
    hosts.refresh()
    assert hosts.usable() == {"localhost": 1, "127.0.0.2": 1}
    blacklist.add("127.0.0.2")
    hosts.refresh()
    assert hosts.usable() == {"localhost": 1}  # still listed: stays out
    pool.write_text("localhost\n")
    hosts.refresh()
    assert "host 127.0.0.2 left the pool (discovery no longer lists it)" in logs
    pool.write_text("localhost\n127.0.0.2\n")
    hosts.refresh()
    assert hosts.usable() == {"localhost": 1, "127.0.0.2": 1} and not blacklist.blocks("127.0.0.2")
    assert any("127.0.0.2 is listed again after discovery dropped it: off the blacklist" in line for line in logs)


def view(worker_id, host, running=True, member=True, standing_by=False, slot=0):
    return WorkerView(worker_id, host, slot, running, member, standing_by)


def test_the_plan_counts_only_running_members_and_fills_from_spares_then_free_slots():
    # a member stopped (its host left): the generation is broken; the standing-by spare is promoted first
    workers = [view("w0", "a"), view("w1", "b", running=False), view("w2", "c", member=False),
               view("w3", "d", member=False, standing_by=True)]
    plan = plan_membership(workers, True, [("e", 0)], max_np=3, needed=2, spares=1)
    assert plan.publish and plan.broken and plan.members == ("w0", "w3", "w2") and plan.promoted == ("w3", "w2")
    assert plan.start_members == () and plan.start_spares == (("e", 0),)
    # nothing changed, a free slot and no spare: a spare starts, no generation is due
    steady = plan_membership([view("w0", "a"), view("w1", "b")], True, [("c", 0)], max_np=2, needed=1, spares=1)
    assert not steady.publish and steady.start_spares == (("c", 0),)
    # below the minimum: wait, start nothing
    low = plan_membership([view("w0", "a"), view("w1", "b", running=False)], True, [], max_np=3, needed=2, spares=1)
    assert low.waiting_for == 2 and not low.publish and low.start_members == low.start_spares == ()
