"""Results as plain-text tables (Markdown, aligned, so they read well in a terminal and paste anywhere)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .sizes import format_size


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """An aligned Markdown table; ``right[i]`` right-aligns column i (numbers)."""
    right = list(right) if right is not None else [False] * len(headers)
    if len(right) != len(headers) or any(len(row) != len(headers) for row in rows):
        raise ValueError("every row and the alignment need one entry per header")
    widths = [max(3, len(header), *(len(row[i]) for row in rows)) for i, header in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(cells, widths, right, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if r else "-" * (w + 2) for w, r in zip(widths, right, strict=True))
    return "\n".join([line(headers), rule + "|", *(line(row) for row in rows)])


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 100 else f"{value:.1f}"


def describe_job(result: Mapping[str, Any]) -> str:
    """A line or two about where, with what and on what the numbers were measured."""
    meta = result.get("meta", {})
    if result.get("mode") == "scaling-small-ops":
        sizes = ", ".join(map(str, result["runs"]))
        return (f"torchring, raw c10d (Gloo) and Horovod in jobs of their own at {sizes} ranks on this host; "
                f"medians of {result['options']['latency_rounds']} latency and {result['options']['burst_rounds']} "
                "burst samples, each the slowest rank's; init: from the last rank's call to the last rank's first "
                "barrier")
    hosts = ", ".join(sorted(set(meta.get("hostnames", [])))) or "?"
    ranks = f"{meta.get('world_size', '?')} ranks"
    if result.get("mode") == "scaling":
        ranks = f"{result['framework']} at 1..{meta.get('world_size', '?')} ranks"
    text = (f"{ranks} on {hosts}; torch {meta.get('torch_version', '?')}, torchring "
            f"{meta.get('torchring_version', '?')}, {meta.get('threads', '?')} thread(s) per rank")
    if result.get("mode") in ("train", "scaling"):
        text += (f"\nmodel {result['model']}, batch {result['batch_size']} per rank, {result['rounds']} round(s) of "
                 f"{result['warmup_batches']} warm-up + {result['batches_per_round']} timed batches")
    return text


def collectives_table(result: Mapping[str, Any]) -> str:
    """One row per operation and size: median latencies (ms), their ratio, and bandwidths (GB/s)."""
    headers = ["op", "size", "iters", "torchring ms", "raw ms", "ratio", "torchring algbw", "torchring busbw",
               "raw algbw", "raw busbw"]
    rows = []
    for entry in result["results"]:
        ours, raw = entry["torchring"], entry["raw"]
        rows.append([entry["op"], format_size(entry["bytes"]), str(entry["iters"]),
                     _ms(ours["latency_ms"]["median"]), _ms(raw["latency_ms"]["median"]), _number(entry["ratio"]),
                     _number(ours["algbw_gbps"], 3), _number(ours["busbw_gbps"], 3),
                     _number(raw["algbw_gbps"], 3), _number(raw["busbw_gbps"], 3)])
    return markdown_table(headers, rows, [False, True, True, True, True, True, True, True, True, True])


def burst_line(result: Mapping[str, Any]) -> str | None:
    """The burst measurement as one line, when it was taken."""
    burst = result.get("burst")
    if not burst:
        return None
    line = (f"burst: {burst['count']} x {format_size(burst['bytes'])} allreduce_async + synchronize "
            f"{burst['torchring_ms']['median']:.2f} ms vs {burst['count']} blocking raw all_reduce "
            f"{burst['raw_blocking_ms']['median']:.2f} ms: {burst['speedup']:.1f}x faster")
    if "horovod_ms" in burst:
        line += (f"; Horovod's allreduce_async_ + synchronize {burst['horovod_ms']['median']:.2f} ms "
                 f"(torchring {burst['vs_horovod']:.2f}x Horovod's speed)")
    elif result.get("horovod_skipped"):
        line += f"; Horovod not measured: {result['horovod_skipped']}"
    return line


COLLECTIVES_LEGEND = ("ms: median latency; ratio: torchring ms / raw ms; algbw, busbw: GB/s (10^9 bytes/s) "
                      "at the median latency; raw: torch.distributed on a plain gloo group")


def train_table(result: Mapping[str, Any]) -> str:
    """One row per framework: mean img/s ± its 95% interval, per rank, and the ratio to DDP and (when it ran)
    to Horovod (ratio of the means, ± the 95% interval of the per-round ratios)."""
    peers = [peer for peer in ("ddp", "horovod") if peer in result["frameworks"]] or ["ddp"]
    if result.get("autotune"):
        peers.insert(0, "torchring")
    headers = ["framework", "img/s", "± 95%", "img/s per rank"]
    for peer in peers:
        headers += [f"vs {peer}", "± 95%"]
    headers += ["engine ms/step", "lane ms/step", "lane copies ms/step"]
    world_size = result.get("meta", {}).get("world_size", 1)
    rows = []
    for name, entry in result["frameworks"].items():
        summary = entry["summary"]
        row = [name, _number(summary["mean"], 1), _number(summary["ci95"], 1), _number(summary["mean"] / world_size, 1)]
        for peer in peers:
            per_round = entry.get(f"ratio_to_{peer}_per_round") or {}
            row += [_number(entry.get(f"ratio_to_{peer}")),
                    _number(per_round.get("ci95")) if name != peer and per_round else ""]
        cpu = [entry.get(key) for key in ("engine_cpu_ms_per_step", "lane_cpu_ms_per_step",
                                          "lane_copies_ms_per_step")]
        rows.append([*row, *(_number(ms, 3) if ms is not None else "" for ms in cpu)])
    return markdown_table(headers, rows, [False, *[True] * (len(headers) - 1)])


TRAIN_LEGEND = ("engine ms/step: CPU time of torchring's engine thread per training step (negotiation, fusion "
                "planning, launching, bookkeeping; not the averaging and copies done on the data path); lane ms/step: "
                "CPU time of DistributedOptimizer's bucket lane per step (bookkeeping and launching, once the ranks "
                "have agreed on the buckets); lane copies: its packing, unpacking and scaling of gradients (the "
                "copies DDP's reducer makes too); each the most of any rank")


def scaling_table(result: Mapping[str, Any]) -> str:
    """One row per job size: mean img/s ± 95%, and efficiency (img/s at n) / (n × img/s at 1)."""
    headers = ["ranks", "img/s", "± 95%", "img/s per rank", "efficiency"]
    rows = []
    for run in result["runs"]:
        summary = run["summary"]
        rows.append([str(run["world_size"]), _number(summary["mean"], 1), _number(summary["ci95"], 1),
                     _number(summary["mean"] / run["world_size"], 1), _number(run["efficiency"])])
    return markdown_table(headers, rows, [True, True, True, True, True])


def notes(result: Mapping[str, Any]) -> list[str]:
    """Lines about frameworks that were skipped."""
    lines = [f"note: {name} skipped: {reason}" for name, reason in result.get("skipped", {}).items()]
    for name, found in (result.get("autotune") or {}).items():
        values = found["values"]
        lines.append(f"note: {name} chose cycle {values['cycle_time_ms']:.2f} ms, fusion "
                     f"{values['fusion_threshold_mb']:.1f} MB, buckets {values['bucket_cap_mb']:.1f} MB after "
                     f"{found['steps']} tuning steps ({found['seconds']:.1f} s: {found['warmup_samples']} warm-up, "
                     f"{found['samples']} scored and {found.get('confirm_samples', 0)} confirming samples of "
                     f"{found['steps_per_sample']} steps); its rounds ran "
                     "with these values, the other torchring rounds with the job's settings")
    return lines
