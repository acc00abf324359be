"""``torchring bench control-plane``: the real coordination code over virtual ranks, and its report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchring.bench.control_plane import VirtualControlChannel, simulate
from torchring.runtime.coordination.control import SLOT_BYTES, allgather_wire_bytes, and_wire_bytes


def test_wire_bytes_count_a_ring_allgather_and_the_second_round_of_a_large_payload():
    assert allgather_wire_bytes([10, 10]) == 2 * SLOT_BYTES
    assert allgather_wire_bytes([10] * 5) == 2 * 4 * SLOT_BYTES
    assert allgather_wire_bytes([10, 10_000, 10]) == 2 * 2 * SLOT_BYTES + 2 * 2 * 10_000


def test_the_virtual_channel_returns_every_ranks_payload_with_its_own_in_place():
    channel = VirtualControlChannel(rank=1, size=3)
    channel.post([b"a", b"posted", b"c"])
    assert channel.allgather_bytes(b"mine") == [b"a", b"mine", b"c"]
    assert channel.wire_bytes == allgather_wire_bytes([1, 4, 1])


def test_every_cycle_releases_every_request_at_each_size():
    for size in (2, 8, 64):
        costs = simulate(size, requests=8, new_requests=3, cycles=3)
        assert costs.virtual_ranks == size
        # the probe: status, epoch, one word of cache bits and its complement (8 requests: 8 slots)
        assert costs.steady_bytes_per_rank == and_wire_bytes(4, size)
        assert costs.new_request_bytes_per_rank == allgather_wire_bytes([100] * size)  # each fits one slot
        assert costs.steady_cpu_s_per_cycle > 0 and costs.new_request_cpu_s_per_cycle > 0


def test_the_steady_state_costs_the_same_bytes_at_any_size():
    small, large = simulate(8, cycles=3), simulate(2048, cycles=3)
    assert large.steady_bytes_per_rank <= 1024
    assert large.new_request_bytes_per_rank > 100 * small.new_request_bytes_per_rank  # the all-gather: O(N)


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
