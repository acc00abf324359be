"""``GlooControlChannel`` over a real Gloo group: the all-gather and the exchange through rank 0, with
payloads and replies that fit one slot and ones that take the second round."""

from datetime import timedelta

import pytest
import torch.distributed as dist

from torchring.runtime import context
from torchring.runtime.coordination.control import SLOT_BYTES, GlooControlChannel
from torchring.runtime.dataplane.data_groups import DataGroups

_opened = 0


@pytest.fixture
def channel(rank, size):
    global _opened
    _opened += 1  # every rank runs the same tests in the same order: the same prefix everywhere
    store = dist.PrefixStore(f"test-control-channel/{_opened}", context.current().store)
    group = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=60)) if size > 1 else None
    yield GlooControlChannel(group, rank, size)
    DataGroups(group).shutdown()  # destroyed now, not at interpreter exit (see context.shutdown)


def _payload(rank: int, length: int) -> bytes:
    return bytes((rank * 7 + i) % 251 for i in range(length))


def _numbered(payloads: list[bytes]) -> bytes:
    """A combine whose reply names every rank's payload length and checksum, in rank order."""
    return b";".join(f"{r}:{len(p)}:{sum(p)}".encode() for r, p in enumerate(payloads))


def _expected(lengths: list[int]) -> bytes:
    return _numbered([_payload(r, n) for r, n in enumerate(lengths)])


@pytest.mark.parametrize("long_rank", [None, 1])
def test_gather_and_broadcast_gives_every_rank_rank_0s_reply(channel, rank, size, long_rank):
    lengths = [10 + r for r in range(size)]
    if long_rank is not None and long_rank < size:
        lengths[long_rank] = 3 * SLOT_BYTES  # does not fit a slot: a second round at full width
    assert channel.gather_and_broadcast(_payload(rank, lengths[rank]), _numbered) == _expected(lengths)


def test_a_reply_longer_than_a_slot_reaches_every_rank_whole(channel, rank, size):
    def long_reply(payloads: list[bytes]) -> bytes:
        return b"".join(payloads) * 200

    payloads = [_payload(r, 50) for r in range(size)]
    reply = channel.gather_and_broadcast(payloads[rank], long_reply)
    assert len(reply) > SLOT_BYTES and reply == b"".join(payloads) * 200


def test_exchanges_of_both_kinds_interleave(channel, rank, size):
    for round_ in range(5):
        mine = _payload(rank, 20 + round_)
        assert channel.allgather_bytes(mine) == [_payload(r, 20 + round_) for r in range(size)]
        lengths = [20 + round_] * size
        assert channel.gather_and_broadcast(mine, _numbered) == _expected(lengths)


@pytest.mark.parametrize("words", [3, 700])  # a slot's worth gathered, and past it (the allreduce)
def test_the_and_through_rank_0_equals_the_allreduce(channel, rank, size, words):
    mine = [(-1 ^ (1 << ((rank + i) % 63))) for i in range(words)]  # every rank clears a different bit
    expected = [-1] * words
    for r in range(size):
        expected = [e & (-1 ^ (1 << ((r + i) % 63))) for i, e in enumerate(expected)]
    assert channel.allreduce_and(mine, through_root=True) == expected
    assert channel.allreduce_and(mine) == expected
