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

import functools
import heapq
import operator
from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator
from typing import Any

from ..requests import DATA_OPS, OpType, RequestMeta
from .negotiation import Response

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
        #: slot → its response, for entries that can skip negotiation when every rank announces them
        #: (global process set, not part of a group): see ``take_common``.
        self._whole: dict[int, Response] = {}
        #: The slots of entries this rank takes no part in (another process set's), one bit each.
        self.foreign_mask = 0
        self.hits = 0
        self.misses = 0
        #: Entries evicted so far: a slot holds the same response until this changes.
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def slot_span(self) -> int:
        """One more than the highest slot ever used (the same on every rank): the width of a mask."""
        return self._next_slot

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
        return mask_to_bytes(mask), tuple(misses)

    # ---- every rank's side ----------------------------------------------------------------------

    def decode(self, rank: int, mask: bytes) -> list[RequestMeta]:
        """The requests ``rank`` announced as cache bits, with sequence numbers ordered by slot (bits of
        entries ``rank`` takes no part in are skipped)."""
        return [RequestMeta._make((*self._by_rank[slot][rank], _CACHED_SEQ_BASE + slot)) for slot in _set_bits(mask)
                if rank in self._by_rank[slot]]

    def whole(self, slot: int) -> Response | None:
        """The cached response in ``slot`` when it can skip negotiation (see ``take_common``), else None."""
        return self._whole.get(slot)

    def take_common(self, masks: list[bytes],
                    pending: Container[tuple[int, str]]) -> tuple[list[Response], list[bytes]]:
        """The requests every rank announced from the cache in this cycle that need no negotiation: cached
        entries of the global process set, not in a group, with nothing pending under their key. Every
        member sent exactly what it sent before, so the response is the cached one. Returns those
        responses (ordered by slot, the same on every rank) and the masks without their bits."""
        values = [int.from_bytes(mask, "little") for mask in masks]
        common = functools.reduce(operator.and_, values) if values else 0
        ready: list[Response] = []
        taken = 0
        for slot in bits_of(common):
            response = self._whole.get(slot)
            if response is None or response.key in pending:
                continue
            ready.append(response)
            taken |= 1 << slot
            self._entries.move_to_end(slot)
        if not taken:
            return [], masks
        return ready, [mask_to_bytes(value & ~taken) for value in values]

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
        else:
            self.foreign_mask |= 1 << slot
        if response.process_set == 0 and not response.template.group:
            self._whole[slot] = response

    def _take_new_slot(self) -> int:
        slot = self._next_slot
        self._next_slot += 1
        return slot

    def _evict(self, slot: int) -> None:
        self.evictions += 1
        key = self._entries.pop(slot)
        del self._by_rank[slot]
        self._whole.pop(slot, None)
        self.foreign_mask &= ~(1 << slot)
        del self._slot_of_entry[key]
        own = dict(key).get(self.rank)
        if own is not None and self._slot_of_own.get(own) == slot:
            del self._slot_of_own[own]
        heapq.heappush(self._free_slots, slot)


def _cacheable(response: Response) -> bool:
    """Successful data operations and barriers in which every member took part (no joined ranks). A
    cached barrier is a cache bit like a cached allreduce, so a loop of barriers and operations stays
    in the steady state (uncached, every barrier cost a failed probe and a full exchange)."""
    return (response.error is None and (response.op_type in DATA_OPS or response.op_type is OpType.BARRIER)
            and len(response.metas) == len(response.members) and bool(response.members))


def _set_bits(mask: bytes) -> Iterator[int]:
    return bits_of(int.from_bytes(mask, "little"))


def mask_to_bytes(value: int) -> bytes:
    """A cache bit mask as the little-endian bytes an announcement carries (empty for no bits)."""
    return value.to_bytes((value.bit_length() + 7) // 8, "little") if value else b""


def bits_of(value: int) -> Iterator[int]:
    """The positions of the bits set in ``value``, lowest first."""
    while value:
        low = value & -value
        yield low.bit_length() - 1
        value ^= low
