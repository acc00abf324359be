"""``torchring bench control-plane``: what one negotiation cycle costs a rank at N ranks, without N processes.

The engine's real coordination code runs for ``N`` virtual ranks in this process: each rank's requests go
through its response cache (``ResponseCache.encode``) into an ``Announcement``, which the engine's
``CycleExchange`` settles (the probe of the steady state, else the all-gather of every announcement and
``cycle.negotiate_cycle`` with the ``Negotiator`` over ``N`` ranks) through a ``VirtualControlChannel``
(the ``ControlChannel`` interface without a network); the responses are planned into fused batches
(``BatchPlanner``), exactly as ``Engine._run`` does per cycle. Every rank does the same work, so the CPU
time is measured on one rank; the other ranks' announcements are built outside the timed part. From
``TORCHRING_CONTROL_GATHER_RANKS`` ranks on (default 16), cycles go through rank 0 (the probe's words and,
with new requests, ``ControlChannel.gather_and_broadcast``): then the measured rank is rank 1, and rank 0's
extra part (the coordinator's bytes and the CPU of ``summarize_announcements``) is reported separately. Bytes are what a
rank sends plus receives on the wire (``control.allgather_wire_bytes``, ``control.gather_wire_bytes``,
``control.and_wire_bytes``).

Two kinds of cycle are measured: the **steady state** of a training loop (every rank repeats the same
cached requests) and **new requests** (names no rank has announced before, as in a first step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from ..runtime.coordination.control import ControlChannel, allgather_wire_bytes, and_wire_bytes, gather_wire_bytes
from ..runtime.coordination.cycle import encode_announcement
from ..runtime.coordination.cycles import CycleExchange
from ..runtime.coordination.fusion import BatchPlanner
from ..runtime.coordination.messages import Announcement
from ..runtime.coordination.negotiation import Negotiator, Response
from ..runtime.coordination.response_cache import ResponseCache
from ..runtime.observe.timeline import NullTimeline
from ..runtime.requests import OpType, RequestMeta
from ..settings import Settings
from .options import DEFAULT_NEW_REQUESTS, DEFAULT_REQUESTS, DEFAULT_VIRTUAL_RANKS

__all__ = ["CycleCosts", "VirtualControlChannel", "VirtualRank", "run_control_plane", "simulate"]


class VirtualControlChannel:
    """``ControlChannel`` for one virtual rank: ``allgather_bytes`` returns the payloads the simulator posted
    for the other ranks with this rank's own in its place; ``allreduce_and`` treats the other ranks as sending
    what this one sends (the symmetric steady state). Both add their wire bytes to ``wire_bytes``."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.wire_bytes = 0
        #: Rank 0's part of ``gather_and_broadcast`` (zero while every cycle all-gathers).
        self.coordinator_wire_bytes = 0
        self.coordinator_cpu_s = 0.0
        self._others: list[bytes] = []

    def post(self, payloads: list[bytes]) -> None:
        """Every rank's payload for the next exchange (this rank's entry is replaced by what it sends)."""
        self._others = payloads

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        gathered = list(self._others)
        gathered[self.rank] = payload
        self.wire_bytes += allgather_wire_bytes([len(p) for p in gathered])
        return gathered

    def gather_and_broadcast(self, payload: bytes, combine: Callable[[list[bytes]], bytes]) -> bytes:
        """Runs rank 0's ``combine`` here, timed apart (``coordinator_cpu_s``), with rank 0's wire bytes in
        ``coordinator_wire_bytes``."""
        gathered = list(self._others)
        gathered[self.rank] = payload
        started = time.thread_time()
        reply = combine(gathered)
        self.coordinator_cpu_s += time.thread_time() - started
        lengths = [len(p) for p in gathered]
        self.wire_bytes += gather_wire_bytes(lengths, len(reply), self.rank)
        self.coordinator_wire_bytes += gather_wire_bytes(lengths, len(reply), 0)
        return reply

    def allreduce_and(self, words: list[int], through_root: bool = False) -> list[int]:
        self.wire_bytes += and_wire_bytes(len(words), self.size, through_root, self.rank)
        if through_root:
            self.coordinator_wire_bytes += and_wire_bytes(len(words), self.size, through_root, 0)
        return list(words)

    def close(self) -> None:
        self._others = []


@dataclass(frozen=True)
class CycleCosts:
    """One rank's cost of a cycle at ``virtual_ranks`` ranks (medians over the measured cycles)."""

    virtual_ranks: int
    requests: int
    new_requests: int
    steady_bytes_per_rank: int
    steady_cpu_s_per_cycle: float
    new_request_bytes_per_rank: int
    new_request_cpu_s_per_cycle: float
    #: Whether cycles went through rank 0; then its bytes (steady and new-request) and extra CPU (else 0).
    gathered: bool = False
    coordinator_steady_bytes: int = 0
    coordinator_new_request_bytes: int = 0
    coordinator_new_request_cpu_s: float = 0.0


class VirtualRank:
    """The coordination state of one virtual rank, as an engine holds it, over ``channel`` (a
    ``VirtualControlChannel`` unless given)."""

    def __init__(self, rank: int, size: int, cache_capacity: int, channel: ControlChannel | None = None,
                 gather_ranks: int = 0) -> None:
        everyone = tuple(range(size))
        self.cache = ResponseCache(cache_capacity, rank)
        self.negotiator = Negotiator(size, lambda process_set: everyone if process_set == 0 else None)
        self.planner = BatchPlanner(128 * 1024 * 1024)
        self.channel = channel if channel is not None else VirtualControlChannel(rank, size)
        self.exchange = CycleExchange(self.channel, self.negotiator, self.cache, gather_ranks=gather_ranks)

    def announce(self, metas: Sequence[RequestMeta]) -> Announcement:
        cached, misses = self.cache.encode(metas)
        return Announcement(misses, False, "", cached, ())

    def run_cycle(self, metas: Sequence[RequestMeta]) -> list[Response]:
        """One engine cycle: the responses released, as the fusion planner orders them."""
        responses = self.exchange.run(self.announce(metas), NullTimeline()).responses
        return [response for batch in self.planner.plan(responses) for response in batch]


def _metas(names: Sequence[str], first_seq: int) -> list[RequestMeta]:
    return [RequestMeta(name, OpType.ALLREDUCE, "float32", (1024,), reduce_op=1, seq=first_seq + i)
            for i, name in enumerate(names)]


def _measure(rank: VirtualRank, metas: list[RequestMeta], size: int) -> tuple[int, float, int, float]:
    """Run one cycle of ``metas`` on every virtual rank (the others' announcements untimed); return the
    measured rank's wire bytes and CPU seconds, and rank 0's extra bytes and CPU as coordinator."""
    # the others repeat what rank 0 repeats
    other = encode_announcement(rank.exchange.with_settle(rank.announce(metas), NullTimeline()))
    rank.channel.post([other] * size)
    channel = rank.channel
    channel.wire_bytes, channel.coordinator_wire_bytes, channel.coordinator_cpu_s = 0, 0, 0.0
    started = time.thread_time()
    released = len(rank.run_cycle(metas))
    spent = time.thread_time() - started - channel.coordinator_cpu_s
    if released != len(metas):
        raise AssertionError(f"{size} virtual ranks: {released} of {len(metas)} requests released")
    return channel.wire_bytes, spent, channel.coordinator_wire_bytes, channel.coordinator_cpu_s


def simulate(virtual_ranks: int, requests: int = DEFAULT_REQUESTS, new_requests: int = DEFAULT_NEW_REQUESTS,
             cycles: int = 10, cache_capacity: int = 1024,
             gather_ranks: int = Settings.control_gather_ranks) -> CycleCosts:
    """The cost of a steady-state and of a new-request cycle for one rank among ``virtual_ranks`` (rank 1
    when new requests go through rank 0, whose extra part is reported apart)."""
    if virtual_ranks < 2:
        raise ValueError("--virtual-ranks must be at least 2")
    gathered = 0 < gather_ranks <= virtual_ranks
    rank = VirtualRank(1 if gathered else 0, virtual_ranks, cache_capacity, gather_ranks=gather_ranks)
    seq = 0
    steady = _metas([f"grad.{i}" for i in range(requests)], seq)
    _measure(rank, steady, virtual_ranks)  # first time: negotiated and cached
    steady_samples = []
    for _ in range(cycles):
        seq += requests
        steady_samples.append(_measure(rank, _metas([m.name for m in steady], seq), virtual_ranks))
    new_samples = []
    for cycle in range(cycles):
        seq += requests
        names = [f"new.{cycle}.{i}" for i in range(new_requests)]
        new_samples.append(_measure(rank, _metas(names, seq), virtual_ranks))
    return CycleCosts(
        virtual_ranks=virtual_ranks, requests=requests, new_requests=new_requests,
        steady_bytes_per_rank=int(statistics.median(s[0] for s in steady_samples)),
        steady_cpu_s_per_cycle=statistics.median(s[1] for s in steady_samples),
        new_request_bytes_per_rank=int(statistics.median(s[0] for s in new_samples)),
        new_request_cpu_s_per_cycle=statistics.median(s[1] for s in new_samples),
        gathered=gathered,
        coordinator_steady_bytes=int(statistics.median(s[2] for s in steady_samples)),
        coordinator_new_request_bytes=int(statistics.median(s[2] for s in new_samples)),
        coordinator_new_request_cpu_s=statistics.median(s[3] for s in new_samples),
    )


def _table(results: list[CycleCosts]) -> str:
    lines = ["| virtual ranks | steady bytes/rank | steady CPU ms/cycle | new-request bytes/rank | "
             "new-request CPU ms/cycle | through rank 0: its steady bytes | its new-request bytes | "
             "its extra CPU ms |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        coordinator = (f"{r.coordinator_steady_bytes:,} | {r.coordinator_new_request_bytes:,} | "
                       f"{r.coordinator_new_request_cpu_s * 1e3:.3f}" if r.gathered else "- (all-gather) | - | -")
        lines.append(f"| {r.virtual_ranks} | {r.steady_bytes_per_rank:,} | {r.steady_cpu_s_per_cycle * 1e3:.3f} | "
                     f"{r.new_request_bytes_per_rank:,} | {r.new_request_cpu_s_per_cycle * 1e3:.3f} | {coordinator} |")
    return "\n".join(lines)


def run_control_plane(args: argparse.Namespace) -> int:
    """Simulate every ``--virtual-ranks`` size in turn and print the table (or JSON lines)."""
    sizes = args.virtual_ranks or list(DEFAULT_VIRTUAL_RANKS)
    for flag, value in (("--requests", args.requests), ("--new-requests", args.new_requests),
                        ("--cycles", args.cycles)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    results = []
    for size in sizes:
        if not args.json_lines:
            print(f"torchring bench control-plane: {size} virtual ranks", flush=True)
        result = simulate(size, args.requests, args.new_requests, args.cycles)
        results.append(result)
        if args.json_lines:
            print(json.dumps(asdict(result)), flush=True)
    if not args.json_lines:
        print(f"\n{args.requests} cached requests per steady-state cycle, {args.new_requests} new per new-request "
              "cycle; bytes: sent + received by one rank on the control channel; CPU: one rank's engine work "
              "(encode, exchange, decode, negotiate, plan)\n")
        print(_table(results))
    return 0
