"""Slurm's compressed host and count lists, and ``torchring run``'s reading of an allocation."""

import pytest

from torchring.environments.slurm_lists import SlurmListError, expand_counts, expand_hostlist
from torchring.launch.hosts import HostSlots, HostSpecError, slurm_allocation


@pytest.mark.parametrize("text,hosts", [
    ("node1", ["node1"]),
    ("gpu[03-05,09],cpu1", ["gpu03", "gpu04", "gpu05", "gpu09", "cpu1"]),
    ("h[1-2]", ["h1", "h2"]),
    ("x-[8-10]-ib", ["x-8-ib", "x-9-ib", "x-10-ib"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("a,b[1,3],c", ["a", "b1", "b3", "c"]),
])
def test_host_lists_expand_in_order_keeping_the_width_of_numbers(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text,words", [
    ("gpu[03-05", "unbalanced"), ("gpu]3", "unbalanced"), ("n[5-2]", "backwards"), ("n[a-b]", "not a number"),
    ("n[]", "empty"), ("", "empty"), ("n[1-99999999]", "more than"),
])
def test_malformed_host_lists_are_refused_with_the_reason(text, words):
    with pytest.raises(SlurmListError, match=words):
        expand_hostlist(text)


def test_count_lists_expand_repeats():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    with pytest.raises(SlurmListError, match="N or N"):
        expand_counts("2(3)")


def test_an_allocation_gives_its_nodes_and_tasks_per_node():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "h[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    allocation = slurm_allocation(env)
    assert allocation is not None
    assert allocation.hosts == [HostSlots("h1", 2), HostSlots("h2", 2), HostSlots("h3", 1)]
    assert "Slurm allocation 77: h1:2,h2:2,h3:1" in allocation.describe()
    # without --ntasks the allocation's CPUs are the slots
    cpus = slurm_allocation({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"})
    assert cpus is not None and cpus.hosts == [HostSlots("h1", 4), HostSlots("h2", 4)]


def test_no_allocation_outside_slurm_or_inside_a_job_step():
    assert slurm_allocation({}) is None
    assert slurm_allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h1", "SLURM_STEP_ID": "0"}) is None


def test_an_allocation_whose_counts_do_not_match_its_nodes_says_to_give_hosts():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    with pytest.raises(HostSpecError, match="3 nodes .* 2 slot counts .*give -H"):
        slurm_allocation(env)
