"""The hang report, from text alone: parse the stack dumps ``faulthandler`` writes, group ranks by where
their main thread is, and say which ranks to blame.

Blame rule: frozen ranks (process state ``T``/``t``) first; else the ranks whose main thread is *not*
waiting in a collective (innermost frames in ``torch/distributed/``, torchring's runtime or the Horovod
shim); else the smallest group. Where torchring's runtime recorded them (``flight_report``), each group also
shows its ranks' last collectives and the requests they wait for. Pure functions, no processes: the
detector (``hang_detector``) feeds them.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..sampling.flight_report import format_flight_record, rank_list

__all__ = ["Frame", "RankSample", "ThreadStack", "blame", "format_report", "group_ranks", "parse_dump",
           "hang_reason", "progress_signature", "waiting_in_collective"]

#: How many innermost frames of the main thread say where a rank is (and are shown per group).
SHOWN_FRAMES = 8
#: Path fragments of code that waits for other ranks: a rank whose innermost frames are there is waiting.
COLLECTIVE_PATHS = ("torch/distributed/", "torchring/runtime/", "torchring/collectives.py", "torchring/functions.py",
                    "torchring/optimizer.py", "torchring/reduction.py", "torchring/grouped.py",
                    "torchring/sync_batch_norm.py", "torchring/elastic/", "torchring/compat/", "torch/nn/parallel/")
#: How many ranks of a group have their recorded collectives shown on the console (all are in the file).
SHOWN_OPS_RANKS = 4
#: How many innermost frames are looked at for ``COLLECTIVE_PATHS``.
COLLECTIVE_DEPTH = 6

#: Names of wrappers that say nothing about which collective a rank waits in.
GENERIC_FUNCTIONS = frozenset({"wrapper", "inner", "wait", "_wait", "decorated", "_fn", "<lambda>"})

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')


@dataclass(frozen=True)
class Frame:
    """One Python frame of a dump."""

    file: str
    line: int
    function: str

    def where(self) -> str:
        """``train.py:88``: the file's name and the line."""
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a dump, innermost frame first (faulthandler's order)."""

    ident: str
    current: bool
    frames: tuple[Frame, ...]


@dataclass
class RankSample:
    """What the detector knows about one rank at the time of a report."""

    rank: int
    pid: int | None
    #: ``running``, ``frozen`` (stopped), ``exited`` or ``unsampled`` (remote, or no handler).
    state: str
    threads: tuple[ThreadStack, ...] = ()
    #: The dump as the rank wrote it.
    text: str = ""
    #: Seconds since its stack last changed (None: not known).
    unchanged_s: float | None = None
    #: ``T (stopped)`` from /proc for frozen ranks.
    process_state: str = ""
    cpu_s: float | None = None
    #: Seconds since its dump was last read (a frozen rank's stack is from before it froze).
    sampled_ago_s: float | None = None
    #: What its runtime recorded in its flight record (recent collectives, pending requests, steps), if known.
    ops: dict | None = None


def parse_dump(text: str) -> tuple[ThreadStack, ...]:
    """The threads of one ``faulthandler`` dump (``all_threads=True``); lines it does not know are skipped."""
    threads: list[ThreadStack] = []
    ident, current, frames = None, False, []
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread:
            if ident is not None:
                threads.append(ThreadStack(ident, current, tuple(frames)))
            ident, current, frames = thread.group(2), thread.group(1) == "Current thread", []
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            frames.append(Frame(frame["file"], int(frame["line"]), frame["function"]))
    if ident is not None:
        threads.append(ThreadStack(ident, current, tuple(frames)))
    return tuple(threads)


def main_thread(threads: Sequence[ThreadStack]) -> ThreadStack | None:
    """The thread running the script: its outermost frame is ``<module>`` (else the one that took the signal)."""
    for thread in threads:
        if thread.frames and thread.frames[-1].function == "<module>":
            return thread
    return next((t for t in threads if t.current), threads[0] if threads else None)


def _in_collective_code(frame: Frame) -> bool:
    path = frame.file.replace(os.sep, "/")
    return any(fragment in path for fragment in COLLECTIVE_PATHS) and "torchring/launch/" not in path


def waiting_in_collective(threads: Sequence[ThreadStack]) -> bool:
    """Whether the main thread's innermost frames are in code that waits for other ranks."""
    thread = main_thread(threads)
    return bool(thread) and any(_in_collective_code(f) for f in thread.frames[:COLLECTIVE_DEPTH])


#: Standard-library modules a wait loop of torch's or torchring's sleeps in (their frames change as it loops).
_WAIT_LOOP_FILES = ("/threading.py", "/queue.py", "/selectors.py")


def _in_wait_code(frame: Frame) -> bool:
    path = frame.file.replace(os.sep, "/")
    return _in_collective_code(frame) or path.endswith(_WAIT_LOOP_FILES)


def progress_signature(threads: Sequence[ThreadStack]) -> tuple:
    """What of a rank's stacks must change for the rank to count as making progress: every thread's
    frames, less the innermost run of frames inside torch's, torchring's and their wait loops' code
    (when that run holds any of torch's or torchring's frames). A rank waiting in a collective, whose
    wait loop or engine thread cycles, thus keeps one signature until its own code moves on."""
    signature = []
    for thread in sorted(threads, key=lambda t: t.ident):
        frames = thread.frames
        inner = 0
        while inner < len(frames) and _in_wait_code(frames[inner]):
            inner += 1
        if any(_in_collective_code(frame) for frame in frames[:inner]):
            frames = frames[inner:]
        signature.append(frames)
    return tuple(signature)


def _user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the script's own code (not torch's, torchring's or the standard library's)."""
    for frame in frames:
        path = frame.file.replace(os.sep, "/")
        if not any(part in path for part in ("/site-packages/", "/lib/python", "torchring/", "<frozen")):
            return frame
    return frames[0] if frames else None


def location(sample: RankSample) -> str:
    """Where a rank is, in words: ``waiting in all_reduce (train.py:88)``, ``in load_batch (data.py:41)``,
    ``frozen (process state T, stopped)``."""
    if sample.state == "frozen":
        return f"frozen (process state {sample.process_state})"
    if sample.state == "exited":
        return "exited"
    thread = main_thread(sample.threads)
    if sample.state == "unsampled" or thread is None or not thread.frames:
        return "not sampled (remote or container rank, or no Python stack handler)"
    user = _user_frame(thread.frames)
    if waiting_in_collective(sample.threads):
        library = [f.function for f in thread.frames if _in_collective_code(f)]
        named = [function for function in library if function not in GENERIC_FUNCTIONS] or library
        # the outermost library frame is the function the script called
        called = named[-1] if named else thread.frames[0].function
        return f"waiting in {called} ({user.where()})" if user else f"waiting in {called}"
    inner = thread.frames[0]
    if user is None or user is inner:
        return f"in {inner.function} ({inner.where()})"
    return f"in {inner.function} ({inner.where()}) called from {user.function} ({user.where()})"


def _group_key(sample: RankSample) -> tuple:
    thread = main_thread(sample.threads)
    frames = thread.frames[:SHOWN_FRAMES] if thread and sample.state == "running" else ()
    return (sample.state, sample.process_state, frames)


def group_ranks(samples: Sequence[RankSample]) -> list[list[RankSample]]:
    """Ranks with the same state and the same innermost main-thread frames, largest group first."""
    groups: dict[tuple, list[RankSample]] = {}
    for sample in samples:
        groups.setdefault(_group_key(sample), []).append(sample)
    return sorted(groups.values(), key=lambda group: (-len(group), group[0].rank))


def blame(samples: Sequence[RankSample]) -> list[int]:
    """The ranks the job waits for: frozen ones; else those not waiting in a collective; else the
    smallest group (none when fewer than two groups)."""
    frozen = [s.rank for s in samples if s.state == "frozen"]
    if frozen:
        return frozen
    running = [s for s in samples if s.state == "running" and s.threads]
    not_waiting = [s.rank for s in running if not waiting_in_collective(s.threads)]
    if not_waiting and len(not_waiting) < len(running):
        return not_waiting
    groups = group_ranks(running)
    return [s.rank for s in groups[-1]] if len(groups) > 1 else []


def hang_reason(samples: Sequence[RankSample], blamed: Sequence[int], why: str, noun: str = "rank") -> str:
    """What the summary says the blamed ranks did: froze; waited in a different collective than the
    others (a probable divergence); waited in the same collective as all others; or got stuck outside
    any collective."""
    chosen = [s for s in samples if s.rank in blamed]
    if any(s.state == "frozen" for s in chosen):
        reason = f"froze (process state T, stopped): {why}"
    elif chosen and all(s.threads and waiting_in_collective(s.threads) for s in chosen):
        others = [s for s in samples if s.rank not in blamed and s.state == "running" and s.threads]
        if others and all(waiting_in_collective(s.threads) for s in others):
            theirs = "; ".join(f"{rank_list([s.rank for s in group], noun)} {'is' if len(group) == 1 else 'are'} "
                               f"{location(group[0])}" for group in group_ranks(others))
            reason = (f"probably diverged from the other {noun}s: it is {location(chosen[0])}, while {theirs} "
                      f"({why}; see the report above)")
        else:
            reason = f"waited in a collective that never completed, as every {noun} did ({why}; see the report above)"
    else:
        reason = f"got stuck outside any collective ({why}; see the report above)"
    if len(blamed) > 1:
        reason += f"; blamed: {rank_list(list(blamed), noun)}"
    return reason


def format_report(samples: Sequence[RankSample], title: str, noun: str = "rank",
                  now: float | None = None) -> tuple[list[str], str]:
    """The report's lines for the console (groups, blame, innermost frames, what torchring recorded of
    the ranks' collectives) and its full text for the file (the same, then every rank's whole dump).
    ``now``: the wall-clock time the recorded times are compared with (default: now)."""
    now = time.time() if now is None else now
    blamed = blame(samples)
    lines = [title]
    for group in group_ranks(samples):
        ranks = [s.rank for s in group]
        odd = " — the odd one out" if blamed and set(ranks) <= set(blamed) and len(samples) > len(ranks) else ""
        unchanged = [s.unchanged_s for s in group if s.unchanged_s is not None]
        since = ""
        if unchanged and group[0].state == "frozen":
            since = f" for {min(unchanged):.0f} s"
        elif unchanged and group[0].state == "running":
            since = f"; stack unchanged for {min(unchanged):.0f} s"
        lines.append(f"{rank_list(ranks, noun)}: {location(group[0])}{since}{odd}")
        thread = main_thread(group[0].threads)
        if thread and group[0].state == "frozen" and group[0].sampled_ago_s is not None:
            lines.append(f"  its last stack, sampled {group[0].sampled_ago_s:.0f} s ago:")
        for frame in thread.frames[:SHOWN_FRAMES] if thread else ():
            lines.append(f"    {frame.function} ({frame.file}:{frame.line})")
        for sample in [s for s in group if s.ops][:SHOWN_OPS_RANKS]:
            lines.extend(f"  {noun} {sample.rank}: {line}" for line in format_flight_record(sample.ops, now))
    if blamed:
        lines.append(f"blamed: {rank_list(blamed, noun)}")
    full = ["\n".join(lines), ""]
    for sample in sorted(samples, key=lambda s: s.rank):
        pid = f", pid {sample.pid}" if sample.pid else ""
        full.append(f"==== {noun} {sample.rank} ({sample.state}{pid}) ====")
        full.extend(format_flight_record(sample.ops, now) if sample.ops else [])
        full.append(sample.text.strip() or "(no stack)")
        full.append("")
    return lines, "\n".join(full) + "\n"

