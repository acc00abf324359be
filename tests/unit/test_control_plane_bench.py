"""``torchring bench control-plane``: the real coordination code over virtual ranks, and its report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchring.bench.control_plane import VirtualControlChannel, simulate
from torchring.runtime.coordination.control import (
    SLOT_BYTES,
    allgather_wire_bytes,
    and_wire_bytes,
    gather_wire_bytes,
)


def test_wire_bytes_count_a_ring_allgather_and_the_second_round_of_a_large_payload():
    assert allgather_wire_bytes([10, 10]) == 2 * SLOT_BYTES
    assert allgather_wire_bytes([10] * 5) == 2 * 4 * SLOT_BYTES
    assert allgather_wire_bytes([10, 10_000, 10]) == 2 * 2 * SLOT_BYTES + 2 * 2 * 10_000


def test_the_virtual_channel_returns_every_ranks_payload_with_its_own_in_place():
    channel = VirtualControlChannel(rank=1, size=3)
    channel.post([b"a", b"posted", b"c"])
    assert channel.allgather_bytes(b"mine") == [b"a", b"mine", b"c"]
    assert channel.wire_bytes == allgather_wire_bytes([1, 4, 1])


def test_gather_wire_bytes_count_one_slot_each_way_and_the_rounds_at_full_width():
    assert gather_wire_bytes([10] * 5, 100, rank=3) == 2 * SLOT_BYTES
    assert gather_wire_bytes([10] * 5, 100, rank=0) == 2 * 4 * SLOT_BYTES
    assert gather_wire_bytes([10, 10_000, 10], 100, rank=2) == 2 * SLOT_BYTES + 10_000
    assert gather_wire_bytes([10] * 3, 10_000, rank=1) == 2 * SLOT_BYTES + 10_000 - (SLOT_BYTES - 16)


def test_the_virtual_channel_runs_the_coordinators_combine_over_every_payload():
    channel = VirtualControlChannel(rank=2, size=3)
    channel.post([b"a", b"b", b"posted"])
    assert channel.gather_and_broadcast(b"mine", b"|".join) == b"a|b|mine"
    assert channel.wire_bytes == gather_wire_bytes([1, 1, 4], 8, 2)
    assert channel.coordinator_wire_bytes == gather_wire_bytes([1, 1, 4], 8, 0)


@pytest.mark.parametrize("gather_ranks", [0, 8])
def test_every_cycle_releases_every_request_at_each_size(gather_ranks):
    for size in (2, 8, 64):
        costs = simulate(size, requests=8, new_requests=3, cycles=3, gather_ranks=gather_ranks)
        assert costs.virtual_ranks == size
        # the probe: status, one word of cache bits and its complement (8 requests: 8 slots)
        assert costs.gathered == (gather_ranks and size >= gather_ranks)
        assert costs.steady_bytes_per_rank == and_wire_bytes(3, size, through_root=costs.gathered)
        if costs.gathered:  # one slot to rank 0 and one reply slot back, whatever the size
            assert costs.steady_bytes_per_rank == 2 * 3 * 8  # the words to rank 0, their AND back
            assert costs.coordinator_steady_bytes == 2 * 3 * 8 * (size - 1)
            assert costs.new_request_bytes_per_rank == 2 * SLOT_BYTES
            assert costs.coordinator_new_request_bytes == 2 * (size - 1) * SLOT_BYTES
        else:
            assert costs.new_request_bytes_per_rank == allgather_wire_bytes([100] * size)  # each fits one slot
            assert costs.coordinator_new_request_bytes == 0
        assert costs.steady_cpu_s_per_cycle > 0 and costs.new_request_cpu_s_per_cycle > 0


def test_neither_the_steady_state_nor_a_new_request_cycle_costs_a_rank_more_bytes_at_scale():
    small, large = simulate(16, cycles=3), simulate(2048, cycles=3)
    assert large.steady_bytes_per_rank <= 1024
    assert large.new_request_bytes_per_rank == small.new_request_bytes_per_rank  # through rank 0: O(1)
    assert large.coordinator_new_request_bytes > 100 * small.coordinator_new_request_bytes  # rank 0: O(N)
    assert large.steady_bytes_per_rank == small.steady_bytes_per_rank  # the probe through rank 0: O(1)
    everyone = simulate(2048, cycles=3, gather_ranks=0)  # the all-gather: O(N) on every rank
    assert everyone.new_request_bytes_per_rank > 100 * small.new_request_bytes_per_rank


def test_json_lines_carry_the_documented_fields():
    result = subprocess.run([sys.executable, "-m", "torchring", "bench", "control-plane", "--virtual-ranks", "4",
                             "--virtual-ranks", "16", "--cycles", "2", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["virtual_ranks"] for row in rows] == [4, 16]
    for row in rows:
        for field in ("steady_bytes_per_rank", "steady_cpu_s_per_cycle", "new_request_bytes_per_rank",
                      "new_request_cpu_s_per_cycle"):
            assert row[field] > 0


@pytest.mark.parametrize("flags, message", [(["--virtual-ranks", "1"], "--virtual-ranks must be at least 2"),
                                            (["--cycles", "0"], "--cycles must be at least 1")])
def test_bad_flags_are_usage_errors(flags, message):
    result = subprocess.run([sys.executable, "-m", "torchring", "bench", "control-plane", *flags],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert message in result.stderr
