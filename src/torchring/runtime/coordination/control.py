"""The control plane: byte exchanges among all ranks. ``ControlChannel`` is the interface the engine
and the topology exchange use; ``GlooControlChannel`` runs it over a dedicated Gloo group, and the
control-plane simulator (``bench.control_plane``) drives the same engine code over virtual ranks.
The ``*_wire_bytes`` functions say what one exchange moves through each rank.

Three exchanges: ``allgather_bytes`` (every rank receives every rank's bytes: ``4 KB × N`` each),
``gather_and_broadcast`` (rank 0 receives every rank's bytes and sends everyone one reply: a fixed
``8 KB`` for every other rank, ``8 KB × N`` through rank 0) and ``allreduce_and`` (a few words, by
all-gather, allreduce or, ``through_root``, a gather to rank 0 and a broadcast of the result).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.distributed as dist

_HEADER = struct.Struct("<Q")
#: The reply's header: its length, and (when not 0) the width at which every rank sends its bytes again.
_REPLY_HEADER = struct.Struct("<QQ")
#: Bytes of the fixed slot each rank sends in every exchange (header + payload).
SLOT_BYTES = 4096


class ControlChannel(Protocol):
    """All-gathers one byte string per rank, in rank order. Collective: every rank calls it each time."""

    rank: int
    size: int

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order."""

    def gather_and_broadcast(self, payload: bytes, combine: Callable[[list[bytes]], bytes]) -> bytes:
        """What ``combine`` makes on rank 0 of every rank's ``payload`` (in rank order), on every rank."""

    def allreduce_and(self, words: list[int], through_root: bool = False) -> list[int]:
        """The bitwise AND over every rank of ``words`` (signed 64-bit integers, the same count everywhere);
        ``through_root`` (the same on every rank): rank 0 gathers the words and broadcasts the AND."""

    def close(self) -> None:
        """Stop using the channel (the engine calls this when it stops)."""


def and_by_allgather(words: int, size: int) -> bool:
    """Whether ``allreduce_and`` of ``words`` 64-bit words gathers them instead: while every rank's words
    together fit one control slot, one all-gather step costs less than an allreduce's two (Gloo: about
    0.8 ms against 1.7-2.3 ms for a few words at 2 ranks); beyond that the allreduce's size stays fixed."""
    return size * words * 8 <= SLOT_BYTES


def allreduce_wire_bytes(nbytes: int, size: int) -> int:
    """Bytes one rank sends plus receives in an allreduce of ``nbytes`` over ``size`` ranks, counted as a
    ring allreduce moves them (reduce-scatter then all-gather: ``2 (N - 1) / N`` of the buffer each way)."""
    return 0 if size < 2 else round(4 * (size - 1) / size * nbytes)


def and_wire_bytes(words: int, size: int, through_root: bool = False, rank: int = 1) -> int:
    """Bytes ``rank`` sends plus receives in ``allreduce_and`` of ``words`` words over ``size`` ranks
    (``through_root``: every other rank sends its words to rank 0 and receives the result, so only rank
    0's share grows with ``size``)."""
    if through_root:
        return 2 * 8 * words * (size - 1 if rank == 0 else 1)
    if and_by_allgather(words, size):
        return 2 * (size - 1) * words * 8
    return allreduce_wire_bytes(8 * words, size)


def gather_wire_bytes(payload_lengths: Sequence[int], reply_length: int, rank: int) -> int:
    """Bytes ``rank`` sends plus receives in one ``GlooControlChannel.gather_and_broadcast`` whose payloads
    have these lengths and whose reply has ``reply_length``: every rank sends one slot to rank 0 and
    receives one reply slot (rank 0: ``N - 1`` of each), plus the rounds at full width when a payload or
    the reply does not fit a slot."""
    others = len(payload_lengths) - 1
    peers = others if rank == 0 else 1
    total = 2 * peers * SLOT_BYTES
    if max(payload_lengths, default=0) > SLOT_BYTES - _HEADER.size:
        total += peers * max(payload_lengths)
    if reply_length > SLOT_BYTES - _REPLY_HEADER.size:
        total += peers * (reply_length - (SLOT_BYTES - _REPLY_HEADER.size))
    return total


def allgather_wire_bytes(payload_lengths: Sequence[int]) -> int:
    """Bytes one rank sends plus receives in one ``GlooControlChannel.allgather_bytes`` whose payloads have
    these lengths, counted as a ring allgather moves them: each rank sends and receives the other
    ``N - 1`` slots, then the same again at the largest payload's width when one does not fit a slot."""
    others = len(payload_lengths) - 1
    total = 2 * others * SLOT_BYTES
    if max(payload_lengths, default=0) > SLOT_BYTES - _HEADER.size:
        total += 2 * others * max(payload_lengths)
    return total


def _and_of_rows(gathered: torch.Tensor, size: int) -> torch.Tensor:
    """The bitwise AND of the ``size`` equal parts of ``gathered`` (one per rank, in rank order)."""
    rows = gathered.view(size, -1)
    result = rows[0].clone()
    for row in rows[1:]:
        result &= row
    return result


class GlooControlChannel:
    """All-gathers one byte string per rank over a Gloo group.

    Each rank sends a fixed-size slot holding a length header and its payload, so the common small
    exchange costs a single collective; a payload that does not fit is sent again in a second round
    sized for the largest payload.
    """

    SLOT_BYTES = SLOT_BYTES

    def __init__(self, group: dist.ProcessGroup | None, rank: int, size: int,
                 await_work: Callable[[dist.Work], None] = dist.Work.wait) -> None:
        self.group = group
        self.rank = rank
        self.size = size
        #: Waits for each collective of an exchange: from the first, the engine's ``wakeup.DeferredWake``
        #: wakes idle peers; any ends once another rank's engine posted its failure (``failure_alarm``).
        self._await_work = await_work
        self._slot = bytearray(self.SLOT_BYTES)
        self._gathered = bytearray(self.SLOT_BYTES * size)
        self._slot_tensor = torch.frombuffer(self._slot, dtype=torch.uint8)
        self._gathered_tensor = torch.frombuffer(self._gathered, dtype=torch.uint8)

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order."""
        if self.size == 1:
            return [payload]
        self._fill_slot(payload)
        self._allgather(self._gathered_tensor, self._slot_tensor)
        lengths = self._gathered_lengths()
        if max(lengths) <= self.SLOT_BYTES - _HEADER.size:
            return self._gathered_payloads(lengths)
        return self._allgather_large(payload, lengths)

    def _fill_slot(self, payload: bytes) -> None:
        """This rank's slot: the payload's length, then as much of it as fits."""
        fitted = payload[:self.SLOT_BYTES - _HEADER.size]
        _HEADER.pack_into(self._slot, 0, len(payload))
        self._slot[_HEADER.size:_HEADER.size + len(fitted)] = fitted

    def _gathered_lengths(self) -> list[int]:
        """Every rank's payload length, from the gathered slots."""
        return [_HEADER.unpack_from(self._gathered, r * self.SLOT_BYTES)[0] for r in range(self.size)]

    def _gathered_payloads(self, lengths: list[int]) -> list[bytes]:
        """Every rank's payload, from the gathered slots (each fits its slot)."""
        starts = [r * self.SLOT_BYTES + _HEADER.size for r in range(self.size)]
        return [bytes(self._gathered[start:start + n]) for start, n in zip(starts, lengths, strict=True)]

    def _allgather_large(self, payload: bytes, lengths: list[int]) -> list[bytes]:
        width = max(lengths)
        slot = bytearray(width)
        slot[:len(payload)] = payload
        gathered = bytearray(width * self.size)
        self._allgather(torch.frombuffer(gathered, dtype=torch.uint8), torch.frombuffer(slot, dtype=torch.uint8))
        return [bytes(gathered[r * width:r * width + n]) for r, n in enumerate(lengths)]

    def gather_and_broadcast(self, payload: bytes, combine: Callable[[list[bytes]], bytes]) -> bytes:
        """What ``combine`` makes on rank 0 of every rank's ``payload``, on every rank: one gather of a slot
        per rank and one broadcast of a reply slot; a payload or reply that does not fit takes one more
        round at the width rank 0 announces in the reply's header."""
        if self.size == 1:
            return combine([payload])
        self._fill_slot(payload)
        self._gather(self._slot_tensor, self._gathered_tensor, self.SLOT_BYTES)
        reply = b""
        resend_width = 0
        if self.rank == 0:
            lengths = self._gathered_lengths()
            if max(lengths) <= self.SLOT_BYTES - _HEADER.size:
                reply = combine(self._gathered_payloads(lengths))
            else:
                resend_width = max(lengths)
        reply, resend_width = self._broadcast_reply(reply, resend_width)
        if not resend_width:
            return reply
        slot = bytearray(resend_width)
        slot[:len(payload)] = payload
        gathered = bytearray(resend_width * self.size if self.rank == 0 else 0)
        self._gather(torch.frombuffer(slot, dtype=torch.uint8),
                     torch.frombuffer(gathered, dtype=torch.uint8) if gathered else None, resend_width)
        if self.rank == 0:
            reply = combine([bytes(gathered[r * resend_width:r * resend_width + n]) for r, n in enumerate(lengths)])
        return self._broadcast_reply(reply, 0)[0]

    def _broadcast_reply(self, reply: bytes, resend_width: int) -> tuple[bytes, int]:
        """Rank 0's ``reply`` and ``resend_width`` on every rank: a slot, then the rest of a long reply."""
        assert self.group is not None
        capacity = self.SLOT_BYTES - _REPLY_HEADER.size
        if self.rank == 0:
            _REPLY_HEADER.pack_into(self._slot, 0, len(reply), resend_width)
            self._slot[_REPLY_HEADER.size:_REPLY_HEADER.size + min(len(reply), capacity)] = reply[:capacity]
        self._await_work(self.group.broadcast([self._slot_tensor], dist.BroadcastOptions()))
        length, resend_width = _REPLY_HEADER.unpack_from(self._slot, 0)
        head = bytes(self._slot[_REPLY_HEADER.size:_REPLY_HEADER.size + min(length, capacity)])
        if length <= capacity:
            return head, resend_width
        rest = bytearray(reply[capacity:]) if self.rank == 0 else bytearray(length - capacity)
        self._await_work(self.group.broadcast([torch.frombuffer(rest, dtype=torch.uint8)], dist.BroadcastOptions()))
        return head + bytes(rest), resend_width

    def _gather(self, slot: torch.Tensor, gathered: torch.Tensor | None, width: int) -> None:
        assert self.group is not None
        outputs = [[gathered[r * width:(r + 1) * width] for r in range(self.size)]] if self.rank == 0 else []
        self._await_work(self.group.gather(outputs, [slot], dist.GatherOptions()))

    def allreduce_and(self, words: list[int], through_root: bool = False) -> list[int]:
        """The bitwise AND over every rank of ``words``: one all-gather while every rank's words fit a slot,
        else one allreduce, or (``through_root``) a gather to rank 0 and a broadcast of the result: two steps
        whatever the size, where a ring allreduce of a few words takes ``2 (N - 1)`` steps one after another."""
        if self.size == 1:
            return list(words)
        assert self.group is not None
        tensor = torch.tensor(words, dtype=torch.int64)
        if through_root:
            return self._and_through_root(tensor)
        if and_by_allgather(len(words), self.size):
            gathered = torch.empty(self.size * len(words), dtype=torch.int64)
            self._allgather(gathered, tensor)
            return _and_of_rows(gathered, self.size).tolist()
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.BAND
        self._await_work(self.group.allreduce([tensor], options))
        return tensor.tolist()

    def _and_through_root(self, tensor: torch.Tensor) -> list[int]:
        width = tensor.numel() * tensor.element_size()
        gathered = torch.empty(self.size * tensor.numel(), dtype=torch.int64) if self.rank == 0 else None
        self._gather(tensor.view(torch.uint8), None if gathered is None else gathered.view(torch.uint8), width)
        if gathered is not None:
            tensor = _and_of_rows(gathered, self.size)
        assert self.group is not None
        self._await_work(self.group.broadcast([tensor], dist.BroadcastOptions()))
        return tensor.tolist()

    def close(self) -> None:
        """Drop the group (the engine calls this when it stops), so that it can be destroyed although
        objects that outlive ``shutdown()`` still refer to the engine."""
        self.group = None

    def _allgather(self, output: torch.Tensor, slot: torch.Tensor) -> None:
        assert self.group is not None
        self._await_work(self.group._allgather_base(output, slot))
