"""One cycle's negotiation: every rank's announcement into the shared table, and the responses it
releases, the same on every rank (``negotiation``), with the response cache's fast path and the
timeline's negotiation marks."""

from __future__ import annotations

import pickle

from ..observe.timeline import NullTimeline, TimelineWriter
from .messages import Announcement
from .negotiation import Negotiator, Response
from .response_cache import ResponseCache


def encode_announcement(announcement: Announcement) -> bytes:
    """This rank's announcement as the bytes it sends on the control channel."""
    return pickle.dumps(announcement, protocol=pickle.HIGHEST_PROTOCOL)


def decode_announcements(payloads: list[bytes]) -> list[Announcement]:
    """Every rank's announcement from what the control channel gathered."""
    return [pickle.loads(payload) for payload in payloads]


def summarize_announcements(payloads: list[bytes]) -> bytes:
    """Rank 0's reply in a gathered exchange: every rank's announcement, each distinct one once.

    Ranks that announce the same requests with the same flags share one entry, so the reply grows with
    the number of distinct announcements (one in a job whose ranks agree), not with the number of ranks.
    The sequence numbers of a shared entry's requests are not per rank in the reply (its lowest rank's:
    they only order responses by their lowest submitting rank, which is always an entry's own)."""
    announcements = decode_announcements(payloads)
    index_of: dict[object, int] = {}
    distinct: list[Announcement] = []
    runs: list[list[int]] = []  # [entry index, number of consecutive ranks that sent it]
    for announcement in announcements:
        key = (tuple(meta.identity for meta in announcement.metas), announcement.shutting_down,
               announcement.stall_abort, announcement.cached, announcement.blocked, announcement.settle,
               announcement.launch_failures)
        try:
            index = index_of.setdefault(key, len(distinct))
        except TypeError:  # an unhashable field: this rank's announcement stands alone
            index = len(distinct)
        if index == len(distinct):
            distinct.append(announcement)
        if runs and runs[-1][0] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, 1])
    return pickle.dumps((distinct, runs), protocol=pickle.HIGHEST_PROTOCOL)


def expand_announcements(reply: bytes) -> list[Announcement]:
    """Every rank's announcement, in rank order, from ``summarize_announcements``'s reply (shared objects)."""
    distinct, runs = pickle.loads(reply)
    announcements: list[Announcement] = []
    for index, count in runs:
        announcements.extend([distinct[index]] * count)
    return announcements


def negotiate_cycle(announcements: list[Announcement], negotiator: Negotiator, cache: ResponseCache,
                    timeline: TimelineWriter | NullTimeline) -> list[Response]:
    """The responses every rank releases this cycle, in the same order on every rank.

    When every rank repeats cached requests only (a training loop's steady state), those skip the table
    (``ResponseCache.take_common``); the rest are decoded and recorded in rank order."""
    timeline.mark_cycle()
    masks = [announcement.cached for announcement in announcements]
    repeated: list[Response] = []
    if all(masks) and not timeline.enabled and not negotiator.joined:
        repeated, masks = cache.take_common(masks, negotiator.pending)
    for rank, (announcement, mask) in enumerate(zip(announcements, masks, strict=True)):
        metas = [*cache.decode(rank, mask), *announcement.metas] if mask else announcement.metas
        if timeline.enabled:
            for meta in metas:
                if not timeline.negotiating(meta.name):  # also one that began before the timeline did
                    timeline.negotiate_start(meta.name, meta.op_type.value)
                timeline.negotiate_rank_ready(meta.name, rank)
        negotiator.record(rank, metas)
    responses = _release(negotiator, cache, timeline)
    return [*repeated, *responses] if repeated else responses


def negotiate_common(mask: bytes, negotiator: Negotiator, cache: ResponseCache,
                     timeline: TimelineWriter | NullTimeline) -> list[Response]:
    """What ``negotiate_cycle`` releases when every rank announced the cache bits ``mask`` and nothing
    else (a cycle settled by the steady-state probe), without a list of N announcements."""
    timeline.mark_cycle()
    if not mask:
        return _release(negotiator, cache, timeline)
    repeated, rest = cache.take_common([mask], negotiator.pending)
    if rest[0]:  # cached requests that still need the table (groups, process sets): every rank's
        for rank in range(negotiator.size):
            negotiator.record(rank, cache.decode(rank, rest[0]))
    return [*repeated, *_release(negotiator, cache, timeline)]


def _release(negotiator: Negotiator, cache: ResponseCache,
             timeline: TimelineWriter | NullTimeline) -> list[Response]:
    """The requests the table holds from every rank now, recorded in the cache."""
    responses = negotiator.take_ready()
    for response in responses:
        if timeline.enabled:
            timeline.negotiate_end(response.name)
        cache.record(response)
    return responses
