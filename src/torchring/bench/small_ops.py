"""``torchring bench scaling --small-ops``: start-up and small operations as the job grows, beside raw c10d
and the real Horovod, all in one run.

Every framework runs in jobs of its own (one launch per framework and job size, in alternating order),
so each pays its own start-up: ``init()`` is timed from the moment the last rank calls it (the ranks
arrive as they finish importing torch and the framework, as in any job) until the last rank's first barrier
returns: the start-up a job waits for beyond its slowest rank's imports. Then, after a barrier each:

* the **latency** of one blocking 4 KB allreduce (a stable name, as a training loop's metric has), and
* the **burst**: 200 × 4 KB allreduce started at once, then waited for (torchring and Horovod:
  ``allreduce_async_`` + ``synchronize``, which their engines fuse; raw c10d: ``all_reduce(async_op=True)``
  then ``wait``),

the slowest rank's time of each sample, median over the samples. For torchring, rank 0's time of each
step of ``init()`` (``Runtime.init_seconds``) comes with it. Horovod is measured when its ``horovod.torch``
can be imported (``shared/peers/build_horovod.sh``), and skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from .collectives import BURST_BYTES, BURST_COUNT, async_burst
from .options import SmallOpsOptions
from .report import markdown_table

__all__ = ["SMALL_OPS_FRAMEWORKS", "job_sizes", "run_jobs", "run_small_ops", "small_ops_table"]

#: The frameworks compared, in the order of the table.
SMALL_OPS_FRAMEWORKS = ("torchring", "c10d", "horovod")
#: Elements of the latency probe's tensor (4 KB of float32).
_SMALL = 1024


def job_sizes(max_np: int) -> list[int]:
    """2, 4, 8, ... up to ``max_np`` (and ``max_np`` itself)."""
    sizes = [n for n in (2 ** k for k in range(1, 16)) if n < max_np]
    return [*sizes, max_np] if max_np >= 2 else []


class _Framework:
    """The few calls the measurements need, for one framework."""

    def __init__(self, name: str, init: Callable[[], None], barrier: Callable[[], None],
                 small: Callable[[torch.Tensor], None], burst: Callable[[list[torch.Tensor]], None],
                 slowest: Callable[[torch.Tensor], torch.Tensor], shutdown: Callable[[], None]) -> None:
        self.name, self.init, self.barrier, self.small, self.burst = name, init, barrier, small, burst
        self.slowest, self.shutdown = slowest, shutdown


def _torchring() -> _Framework:
    """torchring, with its modules loaded: ``import torchring`` loads them on first use, which would put the
    last rank's imports (40-90 ms of CPU here) inside the timed ``init()``; Horovod's and c10d's are loaded
    before their timers too."""
    import torchring
    from torchring import basics, collectives  # noqa: F401 - loaded here, not inside the timed init()

    def slowest(values: torch.Tensor) -> torch.Tensor:
        return torchring.allreduce(values, op=torchring.Max, name="bench.small_ops.slowest")

    return _Framework("torchring", torchring.init, torchring.barrier,
                      lambda t: torchring.allreduce_(t, name="bench.small_ops.latency", op=torchring.Sum),
                      lambda ts: async_burst(torchring, ts, torchring.Sum), slowest, torchring.shutdown)


def _c10d() -> _Framework:
    def burst(tensors: list[torch.Tensor]) -> None:
        for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
            work.wait()

    def slowest(values: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values

    return _Framework("c10d", lambda: dist.init_process_group("gloo", init_method="env://"), dist.barrier,
                      dist.all_reduce, burst, slowest, dist.destroy_process_group)


def _horovod(world_size: int) -> _Framework | str:
    """Horovod, ready for ``hvd.init()`` (its rendezvous is set up through a c10d group first), or why not."""
    from .horovod_peer import everyone_agrees, load_horovod

    dist.init_process_group("gloo", init_method="env://")
    hvd, reason = load_horovod(world_size, initialise=False)
    if not everyone_agrees(hvd is not None):
        return reason or "Horovod could not be loaded on every rank"
    assert hvd is not None

    def slowest(values: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(values, op=hvd.Max, name="bench.small_ops.slowest")

    return _Framework("horovod", hvd.init, lambda: hvd.allreduce(torch.zeros(1), name="bench.barrier"),
                      lambda t: hvd.allreduce_(t, name="bench.small_ops.latency", op=hvd.Sum),
                      lambda ts: async_burst(hvd, ts, hvd.Sum), slowest, hvd.shutdown)


def _samples(framework: _Framework, run: Callable[[], Any], rounds: int, warmup: int) -> list[float]:
    """Milliseconds of ``run`` on the slowest rank, one sample per round after a barrier."""
    times = torch.zeros(rounds, dtype=torch.float64)
    for index in range(warmup + rounds):
        framework.barrier()
        started = time.perf_counter()
        run()
        if index >= warmup:
            times[index - warmup] = (time.perf_counter() - started) * 1000.0
    return framework.slowest(times).tolist()


def run_small_ops(options: SmallOpsOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """One rank's part of a ``--small-ops`` job; rank 0's return value is the job's result."""
    size = int(os.environ["WORLD_SIZE"])
    if options.framework == "horovod":
        made = _horovod(size)
        if isinstance(made, str):
            return {"framework": "horovod", "world_size": size, "skipped": made}
        framework = made
    else:
        framework = _torchring() if options.framework == "torchring" else _c10d()
    called = time.time()  # the wall clock: the ranks share this host's (``_hosts`` allows no other)
    framework.init()
    framework.barrier()
    done = time.time()
    last_called, last_done = framework.slowest(torch.tensor([called, done], dtype=torch.float64)).tolist()
    result: dict[str, Any] = {"framework": framework.name, "world_size": size, "init_s": last_done - last_called}
    if framework.name == "torchring":
        from ..runtime import context

        result["init_steps_s"] = dict(context.current().init_seconds)
    small = torch.ones(_SMALL)
    result["latency_ms"] = statistics.median(_samples(framework, lambda: framework.small(small),
                                                      options.latency_rounds, options.warmup))
    tensors = [torch.full((BURST_BYTES // 4,), float(i)) for i in range(BURST_COUNT)]
    result["burst_ms"] = statistics.median(_samples(framework, lambda: framework.burst(tensors),
                                                    options.burst_rounds, 1))
    log(f"{framework.name} at {size} ranks: init {result['init_s']:.2f} s, 4 KB blocking allreduce "
        f"{result['latency_ms']:.2f} ms, {BURST_COUNT} x 4 KB burst {result['burst_ms']:.1f} ms")
    framework.shutdown()
    if options.framework == "horovod":
        dist.destroy_process_group()
    return result


def _cell(run: dict[str, Any] | None, key: str, digits: int) -> str:
    return "-" if run is None or key not in run else f"{run[key]:.{digits}f}"


def _ratio(ours: dict[str, Any] | None, peer: dict[str, Any] | None, key: str) -> str:
    if ours is None or peer is None or key not in ours or key not in peer or not peer[key]:
        return "-"
    return f"{ours[key] / peer[key]:.2f}"


#: The measurements of each job, as (result key, title, digits).
_MEASUREMENTS = (("init_s", "init(), from the last rank's call to the first barrier, s", 2),
                 ("latency_ms", "one blocking 4 KB allreduce, ms", 2),
                 ("burst_ms", f"{BURST_COUNT} x 4 KB allreduce started at once, then waited for, ms", 1))


def small_ops_table(result: dict[str, Any]) -> str:
    """A table per measurement, one row per job size: each framework's time and torchring's ratio to each
    peer (below 1: torchring is faster); then torchring's ``init()`` steps on rank 0."""
    tables = []
    for key, title, digits in _MEASUREMENTS:
        rows = []
        for size, runs in result["runs"].items():
            rows.append([str(size), *(_cell(runs.get(name), key, digits) for name in SMALL_OPS_FRAMEWORKS),
                         *(_ratio(runs.get("torchring"), runs.get(peer), key) for peer in ("c10d", "horovod"))])
        headers = ["ranks", *SMALL_OPS_FRAMEWORKS, "torchring ÷ c10d", "torchring ÷ horovod"]
        tables.append(f"{title}:\n\n" + markdown_table(headers, rows, [True] * len(headers)))
    steps = [(size, runs["torchring"]["init_steps_s"]) for size, runs in result["runs"].items()
             if "init_steps_s" in runs.get("torchring", {})]
    if steps:
        names = list(dict.fromkeys(name for _, found in steps for name in found))
        step_rows = [[str(size), *(f"{found.get(name, 0.0) * 1e3:.0f}" for name in names)] for size, found in steps]
        tables.append("torchring init() on rank 0, ms per step (waiting for the other ranks included):\n\n"
                      + markdown_table(["ranks", *names], step_rows, [True] * (len(names) + 1)))
    return "\n\n".join(tables)


def run_jobs(sizes: Sequence[int], launch: Callable[[SmallOpsOptions, int], dict[str, Any]],
             options: SmallOpsOptions) -> dict[str, Any]:
    """Every framework at every size, alternating the order from one size to the next; Horovod is not
    tried again once it was skipped."""
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    for index, size in enumerate(sizes):
        runs[size] = {}
        order = SMALL_OPS_FRAMEWORKS if index % 2 == 0 else tuple(reversed(SMALL_OPS_FRAMEWORKS))
        for name in order:
            if name in skipped:
                continue
            print(f"torchring bench scaling --small-ops: {name} on {size} rank(s)", flush=True)
            found = launch(replace(options, framework=name), size)
            if "skipped" in found:
                skipped[name] = found["skipped"]
            else:
                runs[size][name] = found
    return {"mode": "scaling-small-ops", "runs": runs, "skipped": skipped,
            "options": {"latency_rounds": options.latency_rounds, "burst_rounds": options.burst_rounds}}
