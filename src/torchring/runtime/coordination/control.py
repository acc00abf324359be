"""The control plane: a byte exchange among all ranks over a dedicated Gloo group."""

from __future__ import annotations

import struct

import torch
import torch.distributed as dist

_HEADER = struct.Struct("<Q")


class ControlChannel:
    """All-gathers one byte string per rank.

    Each rank sends a fixed-size slot holding a length header and its payload, so the common small
    exchange costs a single collective; a payload that does not fit is sent again in a second round
    sized for the largest payload.
    """

    SLOT_BYTES = 4096

    def __init__(self, group: dist.ProcessGroup | None, rank: int, size: int) -> None:
        self.group = group
        self.rank = rank
        self.size = size
        self._slot = bytearray(self.SLOT_BYTES)
        self._gathered = bytearray(self.SLOT_BYTES * size)
        self._slot_tensor = torch.frombuffer(self._slot, dtype=torch.uint8)
        self._gathered_tensor = torch.frombuffer(self._gathered, dtype=torch.uint8)

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order."""
        if self.size == 1:
            return [payload]
        capacity = self.SLOT_BYTES - _HEADER.size
        _HEADER.pack_into(self._slot, 0, len(payload))
        fitted = payload[:capacity]
        self._slot[_HEADER.size:_HEADER.size + len(fitted)] = fitted
        self._allgather(self._gathered_tensor, self._slot_tensor)
        lengths = [_HEADER.unpack_from(self._gathered, r * self.SLOT_BYTES)[0] for r in range(self.size)]
        if max(lengths) <= capacity:
            return [
                bytes(self._gathered[r * self.SLOT_BYTES + _HEADER.size:r * self.SLOT_BYTES + _HEADER.size + n])
                for r, n in enumerate(lengths)
            ]
        return self._allgather_large(payload, lengths)

    def _allgather_large(self, payload: bytes, lengths: list[int]) -> list[bytes]:
        width = max(lengths)
        slot = bytearray(width)
        slot[:len(payload)] = payload
        gathered = bytearray(width * self.size)
        self._allgather(torch.frombuffer(gathered, dtype=torch.uint8), torch.frombuffer(slot, dtype=torch.uint8))
        return [bytes(gathered[r * width:r * width + n]) for r, n in enumerate(lengths)]

    def close(self) -> None:
        """Drop the group (the engine calls this when it stops), so that it can be destroyed although
        objects that outlive ``shutdown()`` still refer to the engine."""
        self.group = None

    def _allgather(self, output: torch.Tensor, slot: torch.Tensor) -> None:
        assert self.group is not None
        self.group._allgather_base(output, slot).wait()
