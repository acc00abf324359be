"""The response cache: requests negotiated before are announced again as one bit each.

After a request has been negotiated and run, every rank stores the metadata all ranks sent for it in
a slot of the cache. Each rank updates the cache with the same responses in the same order, so slot
numbers agree everywhere. When a rank submits a request whose metadata equals its own part of a cached
entry, it announces the slot's bit instead of the metadata; the others read the metadata back from
their copy of the cache. A request that differs in anything (shape, dtype, op, ...) is not a hit and
is announced in full, so the cross-rank checks still see it. Slots are reused least recently used
first once ``capacity`` entries are held (``HOROVOD_CACHE_CAPACITY``; 0 turns the cache off).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from .negotiation import Response
from .requests import DATA_OPS, RequestMeta

#: Decoded requests get sequence numbers below every real one, ordered by slot.
_CACHED_SEQ_BASE = -(1 << 40)

Identity = tuple[Any, ...]
EntryKey = tuple[tuple[int, Identity], ...]




class ResponseCache:
    """Slots of negotiated requests, identical on every rank."""

    def __init__(self, capacity: int, rank: int) -> None:
        self.capacity = capacity
        self.rank = rank
        self._entries: OrderedDict[int, EntryKey] = OrderedDict()  # slot → all ranks' metas, LRU first
        self._by_rank: dict[int, dict[int, Identity]] = {}  # slot → rank → that rank's request
        self._slot_of_entry: dict[EntryKey, int] = {}
        self._slot_of_own: dict[Identity, int] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    # ---- this rank's side -----------------------------------------------------------------------

    def encode(self, metas: Iterable[RequestMeta]) -> tuple[bytes, tuple[RequestMeta, ...]]:
        """Split this rank's new requests into a bit mask of cache hits and the metadata of the rest."""
        mask = 0
        misses = []
        for meta in metas:
            slot = self._slot_of_own.get(meta.identity) if self.enabled else None
            if slot is None:
                misses.append(meta)
                self.misses += 1
            else:
                mask |= 1 << slot
                self.hits += 1
        return (mask.to_bytes((mask.bit_length() + 7) // 8, "little") if mask else b""), tuple(misses)

    # ---- every rank's side ----------------------------------------------------------------------

    def decode(self, rank: int, mask: bytes) -> list[RequestMeta]:
        """The requests ``rank`` announced as cache bits, with sequence numbers ordered by slot."""
        return [RequestMeta._make((*self._by_rank[slot][rank], _CACHED_SEQ_BASE + slot)) for slot in _set_bits(mask)]

    def record(self, response: Response) -> None:
        """Remember a response that ran; call it on every rank for the same responses in the same order."""
        if not self.enabled or not _cacheable(response):
            return
        slots = {meta.seq - _CACHED_SEQ_BASE for meta in response.metas.values()}
        if len(slots) == 1 and 0 <= (slot := slots.pop()) < self._next_slot and slot in self._entries:
            self._entries.move_to_end(slot)  # every rank announced it from this slot: nothing new
            return
        key: EntryKey = tuple((rank, meta.identity) for rank, meta in sorted(response.metas.items()))
        slot = self._slot_of_entry.get(key)
        if slot is not None:
            self._entries.move_to_end(slot)
            return
        if len(self._entries) >= self.capacity:
            self._evict(next(iter(self._entries)))
        slot = heapq.heappop(self._free_slots) if self._free_slots else self._take_new_slot()
        self._entries[slot] = key
        self._by_rank[slot] = dict(key)
        self._slot_of_entry[key] = slot
        own = dict(key).get(self.rank)
        if own is not None:
            self._slot_of_own[own] = slot

    def _take_new_slot(self) -> int:
        slot = self._next_slot
        self._next_slot += 1
        return slot

    def _evict(self, slot: int) -> None:
        key = self._entries.pop(slot)
        del self._by_rank[slot]
        del self._slot_of_entry[key]
        own = dict(key).get(self.rank)
        if own is not None and self._slot_of_own.get(own) == slot:
            del self._slot_of_own[own]
        heapq.heappush(self._free_slots, slot)


def _cacheable(response: Response) -> bool:
    """Successful data operations in which every member took part (no joined ranks)."""
    return (response.error is None and response.op_type in DATA_OPS
            and len(response.metas) == len(response.members) and bool(response.members))


def _set_bits(mask: bytes) -> Iterator[int]:
    value = int.from_bytes(mask, "little")
    while value:
        low = value & -value
        yield low.bit_length() - 1
        value ^= low
