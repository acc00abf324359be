"""The ranks' flight-recorder files (``torchring.runtime.observe.flight_recorder``) as the launcher sees them:
read one safely (size-capped, JSON only, version-checked: another process wrote it) and say in a few
short lines what a rank last did (its last collectives, the requests it waits for and which ranks
have not submitted them). Pure functions: the hang detector feeds them, and never raises on bad input.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

__all__ = ["MAX_FLIGHT_RECORD_BYTES", "format_flight_record", "progress_mark", "rank_list", "read_flight_record"]


def rank_list(ranks: Sequence[int], noun: str = "rank") -> str:
    """``rank 1`` or ``ranks 0,2`` (``noun`` "worker" for the workers of an elastic job)."""
    return f"{noun} {ranks[0]}" if len(ranks) == 1 else f"{noun}s " + ",".join(str(r) for r in ranks)

#: The most of an flight record that is read; a bigger file is not the recorder's and is ignored.
MAX_FLIGHT_RECORD_BYTES = 256 * 1024
#: Longest operation and request names shown (longer ones are cut, ending in "…").
MAX_NAME_CHARS = 80
#: Collectives and pending requests shown per rank, and missing ranks named per request.
SHOWN_RECENT = 3
SHOWN_PENDING = 3
SHOWN_MISSING = 16


def read_flight_record(path: str | os.PathLike[str]) -> dict | None:
    """A rank's flight record as written by its flight recorder (a JSON object, format version 1), or None when
    the file is missing, bigger than ``MAX_FLIGHT_RECORD_BYTES``, not JSON or not an object of that version."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FLIGHT_RECORD_BYTES + 1)
        if len(data) > MAX_FLIGHT_RECORD_BYTES:
            return None
        content = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(content, dict) or content.get("version") != 1:
        return None
    return content


def _wall(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _shown_text(value: object, limit: int = MAX_NAME_CHARS) -> str | None:
    """``value`` when it is a string, with unprintable characters replaced and cut to ``limit``."""
    if not isinstance(value, str):
        return None
    text = "".join(c if c.isprintable() else "?" for c in value[:limit + 1])
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _ago(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def _operation(entry: dict) -> str | None:
    op, name = _shown_text(entry.get("op"), 30), _shown_text(entry.get("name"))
    return f"{op} '{name}'" if op is not None and name is not None else None


def _missing_text(value: object) -> str:
    if not isinstance(value, list) or not value:
        return ""
    ranks = [r for r in value[:SHOWN_MISSING] if isinstance(r, int) and not isinstance(r, bool)]
    if not ranks:
        return ""
    more = f" (and {len(value) - SHOWN_MISSING} more)" if len(value) > SHOWN_MISSING else ""
    return f"; not yet submitted by {rank_list(ranks)}{more}"


def format_flight_record(ops: dict, now: float) -> list[str]:
    """Short lines for the hang report from one rank's flight record (``read_flight_record``), times relative to
    ``now`` (``time.time()``): ``last collectives: allreduce 'loss' (started 35 s ago, not done), ...``
    and ``waiting for other ranks: allreduce 'loss' since 35 s; not yet submitted by ranks 1,3``.
    Entries with missing or wrongly typed fields are left out; nothing here raises on bad content."""
    if not isinstance(ops, dict):
        return []
    lines = []
    recent = ops.get("recent")
    shown = []
    for entry in recent[-SHOWN_RECENT:] if isinstance(recent, list) else []:
        if not isinstance(entry, dict) or (what := _operation(entry)) is None:
            continue
        started, ended = _wall(entry.get("started_at")), _wall(entry.get("ended_at"))
        if ended is not None:
            shown.append(f"{what} (done {_ago(now - ended)} ago)")
        elif started is not None:
            shown.append(f"{what} (started {_ago(now - started)} ago, not done)")
    if shown:
        lines.append("last collectives: " + ", ".join(shown))
    pending = ops.get("pending")
    entries = [e for e in pending[:64] if isinstance(e, dict)] if isinstance(pending, list) else []
    waiting = []
    for entry in entries:
        what, since = _operation(entry), _wall(entry.get("since"))
        if what is not None and since is not None:
            waiting.append(f"waiting for other ranks: {what} since {_ago(now - since)}"
                           + _missing_text(entry.get("missing_ranks")))
    lines.extend(waiting[:SHOWN_PENDING])
    if len(waiting) > SHOWN_PENDING:
        lines.append(f"and {len(waiting) - SHOWN_PENDING} more pending")
    return lines


def progress_mark(ops: dict | None) -> str | None:
    """What in a rank's flight record says its collectives or steps moved on: its recent collectives, the
    requests it submitted and its step count, not when the file was written nor which ranks a pending
    request still waits for (those change while nothing moves). A different mark than before is progress."""
    if not isinstance(ops, dict):
        return None
    pending = ops.get("pending")
    submitted = [(e.get("op"), e.get("name"), e.get("since")) for e in pending[:64] if isinstance(e, dict)] \
        if isinstance(pending, list) else None
    steps = ops.get("steps")
    waits = steps.get("wait") if isinstance(steps, dict) else None
    stepped = (steps.get("first"), len(waits) if isinstance(waits, list) else None) if isinstance(steps, dict) \
        else None
    return repr((ops.get("recent"), submitted, stepped))
