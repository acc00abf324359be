"""Host strings, host files and rank assignment."""

import pytest

from torchring.launch.hosts import HostSlots, HostSpecError, assign_ranks, is_local_host, parse_hostfile, parse_hosts


def test_parse_hosts_with_and_without_slots():
    assert parse_hosts("a:4,b:2,c") == [HostSlots("a", 4), HostSlots("b", 2), HostSlots("c", 1)]


def test_parse_hosts_accepts_bracketed_ipv6():
    assert parse_hosts("[fe80::1]:2") == [HostSlots("fe80::1", 2)]


@pytest.mark.parametrize("text,message", [
    ("", "empty host entry"),
    ("a:4,,b:2", "empty host entry"),
    ("a:0", "0 slots"),
    ("a:-1", "positive integer"),
    ("a:two", "positive integer"),
    ("a b:2", "malformed"),
    ("a:2,a:2", "listed twice"),
])
def test_parse_hosts_rejects_bad_input(text, message):
    with pytest.raises(HostSpecError, match=message):
        parse_hosts(text)


def test_hostfile_with_comments_blank_lines_and_forms(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\n\nnode1 slots=4\nnode2 slots = 2  # two GPUs\nnode3:3\nnode4\n")
    assert parse_hostfile(path) == [HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("node3", 3),
                                    HostSlots("node4", 1)]


@pytest.mark.parametrize("content,message", [
    ("node1 slots=0\n", "0 slots"),
    ("node1 slots=4 extra\n", "malformed"),
    ("# nothing\n", "lists no hosts"),
    ("node1 slots=2\nnode1 slots=2\n", "listed twice"),
])
def test_hostfile_errors_name_the_line(tmp_path, content, message):
    path = tmp_path / "hosts"
    path.write_text(content)
    with pytest.raises(HostSpecError, match=message):
        parse_hostfile(path)


def test_missing_hostfile_is_a_clear_error(tmp_path):
    with pytest.raises(HostSpecError, match="cannot read host file"):
        parse_hostfile(tmp_path / "nope")


def test_ranks_fill_hosts_in_order_with_horovod_local_and_cross_ranks():
    slots = assign_ranks([HostSlots("a", 2), HostSlots("b", 2)], 4)
    assert [(s.rank, s.hostname, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots] == [
        (0, "a", 0, 2, 0, 2), (1, "a", 1, 2, 0, 2), (2, "b", 0, 2, 1, 2), (3, "b", 1, 2, 1, 2)]
    assert [(s.host_index, s.num_hosts) for s in slots] == [(0, 2), (0, 2), (1, 2), (1, 2)]


def test_uneven_hosts_cross_size_counts_hosts_with_that_local_rank():
    slots = assign_ranks([HostSlots("a", 3), HostSlots("b", 1)], 4)
    assert [(s.local_rank, s.cross_rank, s.cross_size) for s in slots] == [(0, 0, 2), (1, 0, 1), (2, 0, 1), (0, 1, 2)]


def test_fewer_ranks_than_slots_uses_the_first_slots():
    slots = assign_ranks([HostSlots("a", 2), HostSlots("b", 2)], 3)
    assert [s.hostname for s in slots] == ["a", "a", "b"]
    assert slots[2].local_size == 1 and slots[0].local_size == 2


def test_more_ranks_than_slots_names_the_numbers():
    with pytest.raises(HostSpecError, match="-np 5 asks for more ranks than the 4 slots"):
        assign_ranks([HostSlots("a", 2), HostSlots("b", 2)], 5)


def test_local_host_names():
    assert is_local_host("localhost") and is_local_host("127.0.0.1")
    assert not is_local_host("no-such-host-for-torchring.invalid")
