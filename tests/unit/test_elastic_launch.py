"""The elastic launcher's pieces that need no job: discovery output, the blacklist, the failure policy
(replace a worker or blacklist its host), rank assignment, and the elastic flags."""

import argparse
import subprocess

import pytest

from torchring.environments.elastic import format_assignment, parse_assignment
from torchring.launch.cli.arguments import add_run_arguments, config_from_args
from torchring.launch.elastic.discovery import Blacklist, HostDiscovery, parse_discovery_output
from torchring.launch.elastic.failure_policy import FailurePolicy
from torchring.launch.elastic.plan import assign_generation
from torchring.launch.hosts import HostSpecError
from torchring.launch.spawn.rank_env import Placement
from torchring.launch.spawn.worker import ProcessName, Worker


def test_discovery_output_with_and_without_slots():
    assert parse_discovery_output("a:4\n\n b \nc:2\n", slots_per_host=3) == {"a": 4, "b": 3, "c": 2}
    assert parse_discovery_output("a\n", slots_per_host=None) == {"a": 1}
    with pytest.raises(HostSpecError):
        parse_discovery_output("a:x\n", None)


def test_discovery_script_failure_keeps_the_last_good_answer(tmp_path):
    pool = tmp_path / "hosts"
    pool.write_text("a:2\nb\n")
    discovery = HostDiscovery(script=f"cat {pool}", slots_per_host=2)
    assert discovery.find() == {"a": 2, "b": 2} and discovery.last_error == ""
    pool.unlink()
    assert discovery.find() == {"a": 2, "b": 2}
    assert "exited with 1" in discovery.last_error and "No such file" in discovery.last_error
    assert HostDiscovery(fixed=[]).find() == {}


def test_blacklist_for_good_and_with_cooldown():
    now = [100.0]
    forever = Blacklist(clock=lambda: now[0])
    assert forever.add("a") is None and forever.blocks("a") and not forever.blocks("b")
    timed = Blacklist(cooldown_range_s=(5.0, 10.0), clock=lambda: now[0])
    seconds = timed.add("a")
    assert 5.0 <= seconds <= 10.0 and timed.blocks("a")
    now[0] += seconds
    assert not timed.blocks("a")


def worker(worker_id, host, slot):
    return Worker(ProcessName("worker", int(worker_id.removeprefix("w"))), host, Placement.SSH,
                  process=subprocess.Popen(["true"]), relays=(None, None), slot=slot)


def test_a_failed_worker_whose_host_answers_is_replaced_until_failures_repeat_within_the_window():
    now = [0.0]
    policy = FailurePolicy(Blacklist(clock=lambda: now[0]), max_failures=3, window_s=60.0, clock=lambda: now[0])
    first = policy.decide("a", unreachable=None, joined=True)
    assert not first.blacklisted and first.text.startswith("replacing it on a (a still answers; 1 failure(s)")
    now[0] = 50.0
    assert not policy.decide("a", None, True).blacklisted and not policy.blacklist.blocks("a")
    now[0] = 70.0  # the first failure is out of the window: still two within it
    assert not policy.decide("a", None, True).blacklisted
    now[0] = 80.0
    third = policy.decide("a", None, True)
    assert third.blacklisted and third.text == "a blacklisted for good (3 failures there within 60 s)"
    assert policy.blacklist.blocks("a") and not policy.decide("b", None, True).blacklisted


def test_an_unreachable_host_or_one_where_workers_never_joined_is_blacklisted_with_the_cooldown():
    now = [0.0]
    policy = FailurePolicy(Blacklist(cooldown_range_s=(5.0, 5.0), clock=lambda: now[0]), clock=lambda: now[0])
    lost = policy.decide("a", unreachable="lost its SSH connection (ssh exited with 255)", joined=True)
    assert lost.blacklisted and lost.text == "a blacklisted for 5 s (unreachable)"
    never = policy.decide("b", unreachable=None, joined=False)
    assert never.blacklisted and never.text.startswith("b blacklisted for 5 s (its worker never joined a generation")
    now[0] = 5.0
    assert not policy.blacklist.blocks("a") and not policy.decide("a", None, True).blacklisted  # afresh


def test_a_worker_is_unreachable_when_its_ssh_client_exits_with_255_or_its_link_is_cut_off():
    remote = worker("w0", "a", 0)
    remote.returncode = 255
    assert remote.unreachable() == "lost its SSH connection (ssh exited with 255)"
    remote.returncode = 128 + 9  # killed by SIGKILL, its remote supervisor said so: the host answers
    assert remote.unreachable() is None
    local = Worker(ProcessName("worker", 1), "localhost", Placement.LOCAL, process=subprocess.Popen(["true"]),
                   relays=(None, None), returncode=255)
    assert local.unreachable() is None


def test_ranks_follow_host_order_then_slot():
    workers = [("w5", "b", 1), ("w0", "a", 0), ("w3", "b", 0), ("w9", "c", 0)]
    assignments = assign_generation(workers, ["a", "b", "c"])
    summary = {wid: (i.rank, i.size, i.local_rank, i.local_size, i.cross_rank, i.cross_size, i.hostname)
               for wid, i in assignments.items()}
    assert summary == {"w0": (0, 4, 0, 1, 0, 3, "a"), "w3": (1, 4, 0, 2, 1, 3, "b"), "w5": (2, 4, 1, 2, 0, 1, "b"),
                       "w9": (3, 4, 0, 1, 2, 3, "c")}
    for info in assignments.values():
        assert parse_assignment(format_assignment(info)) == info


def elastic_config(*argv):
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return config_from_args(parser.parse_args([*argv, "python", "train.py"]))


def test_elastic_flags():
    config = elastic_config("-np", "3", "--min-np", "2", "--max-np", "4", "-H", "a:2,b:2", "--reset-limit", "5",
                            "--blacklist-cooldown-range", "10", "20", "--elastic-timeout", "60")
    assert config.elastic.min_np == 2 and config.elastic.max_np == 4 and config.elastic.reset_limit == 5
    assert config.elastic.cooldown_range_s == (10.0, 20.0) and config.elastic.elastic_timeout_s == 60.0
    assert config.elastic.initial_np == 3  # the first generation waits for -np workers
    discovered = elastic_config("--min-np", "2", "--host-discovery-script", "./hosts.sh", "--slots-per-host", "4")
    assert discovered.elastic.max_np >= 1 << 20 and discovered.discovery_script == "./hosts.sh"
    assert discovered.slots_per_host == 4 and discovered.hosts == []
    assert elastic_config("-np", "2").elastic is None
    spared = elastic_config("-np", "3", "--min-np", "2", "--spares", "1")
    assert spared.elastic.spares == 1 and spared.hosts[0].slots == 4  # the spare's slot beside -np's


@pytest.mark.parametrize("argv, message", [
    (["--min-np", "3", "--max-np", "2"], "--max-np 2 is smaller than --min-np 3"),
    (["-np", "5", "--min-np", "2", "--max-np", "4"], "-np 5 must lie between"),
    (["--host-discovery-script", "x", "-H", "a:1", "--min-np", "1"], "exclude each other"),
    (["--min-np", "1", "--blacklist-cooldown-range", "5", "1"], "MIN <= MAX"),
    (["--host-discovery-script", "x"], "needs --min-np or -np"),
    (["--min-np", "1", "--spares", "-1"], "--spares -1: must be >= 0"),
    (["--min-np", "2", "--host-discovery-script", "x", "--spares", "1"], "--spares needs --max-np"),
])
def test_bad_elastic_flags(argv, message):
    with pytest.raises(ValueError, match=message):
        elastic_config(*argv)


def test_rank_0_stays_with_a_worker_that_trained_before():
    """A replacement started on the first host must not take rank 0: sync() hands rank 0's values out."""
    previous = {"w0": 0, "w1": 1, "w2": 2}  # w0 on a died; w3 replaces it there
    workers = [("w3", "a", 0), ("w1", "b", 0), ("w2", "c", 0)]
    assignments = assign_generation(workers, ["a", "b", "c"], previous)
    by_rank = [wid for wid, info in sorted(assignments.items(), key=lambda item: item[1].rank)]
    assert by_rank == ["w1", "w3", "w2"]  # w1's host first, then discovery order
    two_slots = assign_generation([("w3", "a", 0), ("w0", "a", 1)], ["a"], {"w0": 0})
    assert two_slots["w0"].rank == 0 and two_slots["w0"].local_rank == 0 and two_slots["w3"].rank == 1
