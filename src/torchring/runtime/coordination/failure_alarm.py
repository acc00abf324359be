"""An engine's failure, posted in the rendezvous store for the peers whose collective now waits on it.

When an engine fails (a peer died under its control collective), its rank stops taking part in the
control plane, but that does not always reach the other ranks at once: a rank that sent its part of an
exchange through rank 0 waits for rank 0 to receive it (Gloo completes such a send only once the
receiver posted its receive), and a rank whose ring neighbours are alive waits on them. Such a rank
learned of the failure only from Gloo's timeout (30 s by default) or from its neighbours failing in turn.

So a failing engine posts its rank and error under one key of its generation, signed with the job's
secret, and an engine whose collective has waited ``CHECK_EVERY_S`` looks at that key once per slice of
that length: a posted failure ends the wait with an error naming the rank whose engine failed and why. A
wait that is only slow (a peer still computing) costs one store look-up per slice. A value not signed
by the job is ignored (warned about once): whoever can reach the store cannot stop a job's collectives.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from ...exceptions import HorovodInternalError
from ...store_auth import AuthenticatedStore
from ..group_reaper import retire_on_failure

__all__ = ["CHECK_EVERY_S", "FailureAlarm", "wait_slice", "wait_unless_alarmed"]

#: How long a collective waits before each look at the alarm (with 1 s a hot spare's recovery took 2.15 s, 1.32 s
#: with 0.1 s: ``benchmarks/elastic_statistics.py --only recovery``).
CHECK_EVERY_S = 0.1
#: The longest error text an alarm carries.
_MAX_TEXT = 600


class FailureAlarm:
    """The alarm of one job generation (``prefix``): ``post`` on a failing engine, ``posted`` elsewhere."""

    def __init__(self, store: AuthenticatedStore, prefix: str) -> None:
        self._store = store
        self._key = f"{prefix}/engine-failed"
        #: Whether this rank's engine saw the alarm (its own failure then does not post over the first).
        self.seen = False

    def post(self, rank: int, text: str) -> None:
        """Tell every rank that ``rank``'s engine failed with ``text`` (best effort: the store may be gone)."""
        if self.seen:
            return
        try:
            self._store.set(self._key, json.dumps({"rank": rank, "text": text[:_MAX_TEXT]}))
        except Exception:  # noqa: BLE001 - the waiting ranks still have Gloo's timeout
            pass

    def posted(self) -> str | None:
        """What a failed engine posted ("rank R's engine failed: ..."), or None."""
        try:
            value = self._store.get(self._key)
        except Exception:  # noqa: BLE001 - the store is gone: the collective fails on its own
            return None
        if value is None:
            return None
        try:
            data = json.loads(value)
            rank, text = int(data["rank"]), str(data["text"])
        except (ValueError, KeyError, TypeError):
            return None
        self.seen = True
        shown = "".join(c if c.isprintable() else "?" for c in text)
        return f"rank {rank}'s engine failed ({shown}), so the collective this rank waited in cannot complete"


def wait_slice(work: Any, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``work`` (a c10d ``Work``): True once it completed (raising its own error if
    it failed), False when the slice ran out first."""
    try:
        work.wait(timedelta(seconds=seconds))
        return True
    except RuntimeError as error:
        if work.is_completed():  # meanwhile, or with its own error: the untimed wait says which
            work.wait()
            return True
        if "timed out" not in str(error).lower():
            raise
        return False


def wait_unless_alarmed(work: Any, alarm: FailureAlarm | None) -> None:
    """Wait for ``work`` (a c10d ``Work``); every ``CHECK_EVERY_S`` look at ``alarm`` and raise
    ``HorovodInternalError`` with what it says once a failed engine posted it. A ``work`` whose wait
    raises goes to the group reaper (``group_reaper.retire_on_failure``)."""
    with retire_on_failure(work):
        if alarm is None:
            work.wait()
            return
        while not wait_slice(work, CHECK_EVERY_S):
            text = alarm.posted()
            if text is not None:
                raise HorovodInternalError(text)
