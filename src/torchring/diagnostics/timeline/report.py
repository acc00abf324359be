"""Output of ``torchring timeline summarize``: JSON-ready data, the text report and the plot of a
``TimelineSummary`` (see ``timeline_summary`` for how the summary is computed)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .summary import TIE_US, TimelineSummary, summarize

__all__ = ["format_summary", "plot", "slowest_rank_line", "summary_to_dict"]


def summary_to_dict(summary: TimelineSummary, top: int | None = None) -> dict[str, Any]:
    """The summary as plain JSON-ready data; ``top`` keeps only that many tensors."""
    data = asdict(summary)
    if top is not None:
        data["tensors"] = data["tensors"][:top]
    for rank_data, rank in zip(data["ranks"], summary.ranks, strict=True):
        rank_data["times_last"] = rank.times_last
        rank_data["mean_wait_s"] = rank.mean_wait_s
    if summary.slowest_rank is not None:
        data["slowest_rank"].update(times_last=summary.slowest_rank.times_last,
                                    mean_wait_s=summary.slowest_rank.mean_wait_s)
    for step_data, step in zip(data["steps"], summary.steps, strict=True):
        step_data["duration_s"] = step.duration_s
        step_data["comm_fraction"] = step.comm_fraction
    return data


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows aligned under their headers: the first column to the left, the others to the right."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [f"{cell:<{widths[0]}}" if index == 0 else f"{cell:>{widths[index]}}"
                 for index, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _bytes(count: float | None) -> str:
    if count is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def slowest_rank_line(summary: TimelineSummary) -> str:
    """``slowest rank: 1 (last to be ready in 18 of 20 negotiations, made the others wait 0.95 s in all)``."""
    rank = summary.slowest_rank
    if rank is None:
        if summary.negotiations or summary.lane_steps:
            return f"slowest rank: none (no rank made the others wait more than {TIE_US / 1000:g} ms)"
        return "slowest rank: unknown (the trace records no rank becoming ready)"
    parts = []
    if rank.negotiations:
        parts.append(f"{rank.last_in_negotiations} of {_plural(rank.negotiations, 'negotiation')}")
    if rank.lane_steps:
        parts.append(f"{rank.last_in_lane_steps} of {_plural(rank.lane_steps, 'lane step')}")
    return (f"slowest rank: {rank.rank} (last to be ready in {' and '.join(parts)}, "
            f"made the others wait {rank.wait_caused_s:.2f} s in all)")


def format_summary(summary: TimelineSummary, top: int = 10) -> str:
    """A readable report: top ``top`` tensors, fusion, waits per rank and the slowest rank, steps."""
    title = f"Timeline {summary.source}" if summary.source else "Timeline"
    lines = [f"{title}: {summary.events} events over {summary.duration_s:.3f} s, "
             f"{_plural(summary.ops, 'operation')} on {_plural(len(summary.tensors), 'tensor')}"]
    if summary.open_spans:
        lines.append(f"({_plural(summary.open_spans, 'span')} never ended: the trace was cut short or the job "
                     "stopped mid-operation)")
    lines += ["", f"Top {min(top, len(summary.tensors))} tensors by communication time"]
    rows = [[t.name, str(t.ops), _ms(t.total_s), _ms(t.mean_s), _ms(t.backend_s), _ms(t.negotiation_s),
             _bytes(t.total_bytes / t.ops if t.total_bytes is not None and t.ops else None)]
            for t in summary.tensors[:top]]
    lines += _table(["tensor", "ops", "total ms", "mean ms", "backend ms", "negotiation ms", "size"], rows)
    fusion = summary.fusion
    lines += ["", "Fusion"]
    if fusion.buffers:
        lines.append(f"{_plural(fusion.buffers, 'fused buffer')} holding {fusion.fused_tensors} tensors: "
                     f"{fusion.mean_tensors:.1f} tensors per buffer on average (max {fusion.max_tensors}), "
                     f"{_bytes(fusion.mean_bytes)} per buffer on average (max {_bytes(fusion.max_bytes)})")
    else:
        lines.append("no fused buffers")
    lines.append(f"{_plural(fusion.unfused_allreduces, 'allreduce')} ran unfused")
    lines += ["", f"Waits per rank ({_plural(summary.negotiations, 'negotiation')} with 2+ ranks, "
                  f"{_plural(summary.lane_steps, 'lane step')})"]
    if summary.ranks:
        rows = [[str(r.rank), f"{r.last_in_negotiations}/{r.negotiations}", f"{r.last_in_lane_steps}/{r.lane_steps}",
                 f"{r.wait_caused_s:.3f}", f"{r.wait_caused_sum_s:.3f}", _ms(r.mean_wait_s)] for r in summary.ranks]
        lines += _table(["rank", "last/negotiations", "last/lane steps", "wait caused s", "summed s", "mean ms"],
                        rows)
    lines.append(slowest_rank_line(summary))
    lines += ["", _steps_text(summary, top)]
    return "\n".join(lines).rstrip() + "\n"


def _steps_text(summary: TimelineSummary, top: int) -> str:
    steps = summary.steps
    if not steps:
        return "Steps: none (no completed operations)"
    durations = [step.duration_s for step in steps]
    busy = sum(step.comm_s for step in steps)
    total = sum(durations)
    lines = [f"Steps: {len(steps)} ({summary.step_rule}); median {_ms(statistics.median(durations))} ms, "
             f"communication {100 * busy / total if total > 0 else 0:.0f}% of the time"]
    if summary.cycle_marks_s:
        lines[0] += f", {_plural(len(summary.cycle_marks_s), 'engine cycle')}"
    if summary.steps_are_windows:
        ranked = sorted(steps, key=lambda s: (-(s.comm_s + s.negotiation_s), s.index))
        label = "busiest (most communication and negotiation time)"
    else:
        ranked = sorted(steps, key=lambda s: (-s.duration_s, s.index))
        label = "longest"
    shown = sorted(ranked[:top], key=lambda s: s.index)
    if len(shown) < len(steps):
        lines.append(f"the {len(shown)} {label}:")
    rows = [[str(s.index), f"{s.start_s:.3f}", _ms(s.duration_s), str(s.ops), _ms(s.comm_s), _ms(s.negotiation_s),
             f"{100 * s.comm_fraction:.0f}", _bytes(s.total_bytes)] for s in shown]
    lines += _table(["step", "start s", "duration ms", "ops", "comm ms", "negotiation ms", "comm %", "bytes"], rows)
    return "\n".join(lines)


def plot(summary_or_events: TimelineSummary | Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> str:
    """Draw communication against time, per step, into the PNG file ``path``; return the path written.

    Top: each step's duration, communication and negotiation time (ms, symmetric log scale) at the step's
    middle. Bottom: the share of each step spent communicating, as a bar spanning the step, with the engine
    cycle marks (``CYCLE_START``) below it when the trace has them.
    """
    summary = summary_or_events if isinstance(summary_or_events, TimelineSummary) else summarize(summary_or_events)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError(f"plotting needs matplotlib ({error}); install it with pip install matplotlib") from None
    target = os.fspath(path)
    figure, (top_axes, bottom_axes) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                                   gridspec_kw={"height_ratios": [3, 2]})
    try:
        steps = summary.steps
        starts = [step.start_s for step in steps]
        middles = [(step.start_s + step.end_s) / 2 for step in steps]
        series = [("step duration", "0.55", "s", [step.duration_s for step in steps]),
                  ("communication", "tab:blue", "o", [step.comm_s for step in steps]),
                  ("negotiation", "tab:orange", "^", [step.negotiation_s for step in steps])]
        for label, color, marker, values in series:
            top_axes.plot(middles, [value * 1000 for value in values], marker, color=color, label=label,
                          markersize=5, linestyle="none")
        if any(step.duration_s > 0 for step in steps):
            top_axes.set_yscale("symlog", linthresh=1.0)
            top_axes.set_xlim(steps[0].start_s, steps[-1].end_s)
        top_axes.set_ylabel("ms per step")
        top_axes.grid(alpha=0.3)
        if steps:
            top_axes.legend(loc="upper right", fontsize="small")
        else:
            top_axes.text(0.5, 0.5, "no completed operations", ha="center", va="center", transform=top_axes.transAxes)
        name = os.path.basename(summary.source) if summary.source else "timeline"
        top_axes.set_title(f"{name}: communication per step — {slowest_rank_line(summary)}", fontsize="medium")
        bottom_axes.bar(starts, [100 * step.comm_fraction for step in steps],
                        width=[step.duration_s for step in steps], align="edge", color="tab:blue", alpha=0.6,
                        edgecolor="white", linewidth=0.5)
        bottom_axes.set_ylim(-12, 105)
        bottom_axes.set_ylabel("communication %")
        bottom_axes.set_xlabel("time since the trace started (s)")
        bottom_axes.grid(alpha=0.3, axis="y")
        if summary.cycle_marks_s:
            bottom_axes.eventplot([summary.cycle_marks_s], lineoffsets=-6, linelengths=8, colors="0.4",
                                  linewidths=0.4)
            bottom_axes.text(0.0, -6, " engine cycles", va="center", fontsize="x-small",
                             transform=bottom_axes.get_yaxis_transform())
        figure.tight_layout()
        figure.savefig(target, format="png", dpi=100)
    finally:
        plt.close(figure)
    return target
