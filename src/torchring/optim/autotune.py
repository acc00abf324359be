"""Autotune (``--autotune``, ``HOROVOD_AUTOTUNE=1``): the engine's cycle time and fusion threshold and the
optimizer's gradient bucket size, tuned while training, scored by measured throughput.

A ``DistributedOptimizer`` drives it from ``step()``. Every ``HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE`` timed
steps (after ``SETTLE_STEPS`` untimed ones following each change) is a **sample**; its score is the
gradient bytes the optimizer reduced per microsecond, as Horovod scores (for a given model, proportional
to steps per second). Rank 0 alone decides: it discards the first ``HOROVOD_AUTOTUNE_WARMUP_SAMPLES``
samples, then measures the current settings and a few spread points, then asks a Bayesian search
(``bayes_search``) for the next point, up to ``HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES`` samples. The point
the search rates best is then measured against the starting values, alternately (``CONFIRM_PAIRS`` each),
and kept only if it is at least as fast: autotune never settles on something slower than the defaults it
measured. After that it keeps scoring samples at the best values, and starts a new search when the
median of the last ``DRIFT_SAMPLES`` scores falls below ``DRIFT_RATIO`` of the median of the first ones
after the search (the data or the machine changed); a re-initialisation (an elastic reset) starts a new
search too, from the best values so far.

Every rank applies the same values after the same step, and never on its own:

1. at the end of each sample every rank allreduces a few numbers in which only rank 0 writes the values
   (every rank also adds 1, so a rank that has joined, which adds zeros, is seen and nothing changes);
2. every rank submits a tuning barrier carrying the engine's values (``runtime.coordination.tuning``),
   which each engine applies at the same place in its response order, so no two ranks fuse differently;
3. every rank re-plans its gradient buckets (``set_bucket_cap``), between the same two steps.

Knobs set explicitly (``HOROVOD_CYCLE_TIME``, ``HOROVOD_FUSION_THRESHOLD``, ``TORCHRING_BUCKET_CAP_MB`` or
the launcher's flags for them) stay as set, as in Horovod. Rank 0 writes every scored sample, and the
best values once chosen, to ``HOROVOD_AUTOTUNE_LOG`` in Horovod's CSV columns (the hierarchical modes are
always 0 here: NCCL picks its algorithms), followed by the bucket size.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import settings
from ..collectives import allreduce
from ..logging_utils import get_logger
from ..process_sets import global_process_set
from ..reduction import ReduceOp
from ..runtime import context
from ..runtime.coordination.tuning import TUNING_BARRIER, EngineTuning
from ..runtime.submit import submit, synchronize
from .bayes_search import BayesianSearch, Knob, search_available

__all__ = ["LOG_HEADER", "SETTLE_STEPS", "AutotuneConfig", "Autotuner", "apply_engine_values", "autotune_start_values",
           "describe", "enable_autotune"]

MB = 1024 * 1024
#: What is tuned, between which bounds (searched on a logarithmic scale).
KNOBS = (Knob("cycle_time_ms", 0.5, 25.0), Knob("fusion_threshold_mb", 1.0, 256.0), Knob("bucket_cap_mb", 1.0, 128.0))
#: The setting behind each knob: one set in the environment is not tuned.
KNOB_SETTINGS = {"cycle_time_ms": "CYCLE_TIME", "fusion_threshold_mb": "FUSION_THRESHOLD",
                 "bucket_cap_mb": "BUCKET_CAP_MB"}
#: Points measured after the current settings, before the search proposes its own (spread over the space).
SPREAD_POINTS = ({"cycle_time_ms": 2.0, "fusion_threshold_mb": 32.0, "bucket_cap_mb": 4.0},
                 {"cycle_time_ms": 5.0, "fusion_threshold_mb": 64.0, "bucket_cap_mb": 64.0},
                 {"cycle_time_ms": 1.0, "fusion_threshold_mb": 8.0, "bucket_cap_mb": 1.0})
#: After the search, its pick and the starting values are measured this many times each, alternately; the pick
#: is kept only if its median is at least the starting values' (a pick among noisy samples is often luck).
CONFIRM_PAIRS = 3
#: Steps after a change that are not timed: the first one re-plans buckets and fills new buffers.
SETTLE_STEPS = 2
#: After the search, the median of the first ``DRIFT_SAMPLES`` samples at the best values is the baseline; when
#: the median of the last ``DRIFT_SAMPLES`` falls below ``DRIFT_RATIO`` of it, a new search starts.
DRIFT_RATIO = 0.7
DRIFT_SAMPLES = 5
#: The log's header: Horovod's columns, then the bucket size.
LOG_HEADER = "hierarchical_allreduce,hierarchical_allgather,cycle_time_ms,tensor_fusion_threshold,score,bucket_cap_mb"

_log = logging.getLogger("torchring")
#: The optimizer this process tunes (the first one built with autotune on, while it lives).
_tuned_optimizer: Callable[[], Any] = lambda: None  # noqa: E731 - a dead weak reference until one is tuned


@dataclass(frozen=True)
class AutotuneConfig:
    """The autotuner's own settings (``HOROVOD_AUTOTUNE_*``) and the knobs held fixed."""

    log_file: str | None = None
    warmup_samples: int = 3
    steps_per_sample: int = 10
    max_samples: int = 20
    noise: float = 0.8
    #: Knobs set explicitly, with their values (not tuned).
    fixed: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AutotuneConfig:
        env = dict(os.environ if env is None else env)
        values = settings.Settings.from_env(env)
        fixed = tuple((knob, _current_values(values)[knob]) for knob, name in KNOB_SETTINGS.items()
                      if any(env.get(n) for n in settings.variable(name).names))
        return cls(values.autotune_log, values.autotune_warmup_samples, max(1, values.autotune_steps_per_sample),
                   values.autotune_bayes_opt_max_samples, values.autotune_gaussian_process_noise, fixed)


def _current_values(values: settings.Settings) -> dict[str, float]:
    return {"cycle_time_ms": values.cycle_time, "fusion_threshold_mb": values.fusion_threshold / MB,
            "bucket_cap_mb": values.bucket_cap_mb}


class _Decider:
    """Rank 0's side: the warm-up, the search, the best values and the drift watch."""

    def __init__(self, config: AutotuneConfig, start: dict[str, float]) -> None:
        self._config = config
        #: Rank 0's lines, prefixed like every rank's (INFO by default, ``HOROVOD_LOG_LEVEL``).
        self._log = get_logger("torchring.autotune")
        self._fixed = dict(config.fixed)
        self._missing = search_available()
        if self._missing:
            self._log.warning("autotune: not tuning, %s; the job runs with its settings", self._missing)
        self.best: dict[str, float] = dict(start)
        self.best_score = 0.0
        self.searching = False
        #: Scores at the best values since the search ended: the baseline's, then the latest ones.
        self._baseline: list[float] = []
        self._recent: list[float] = []
        self._warmup = 0
        self._search: BayesianSearch | None = None
        self._log_file = self._open_log()
        self.restart(start)

    def restart(self, start: dict[str, float]) -> None:
        """A new search from ``start`` (after the warm-up samples)."""
        self.searching = not self._missing
        self._warmup = self._config.warmup_samples
        self._baseline, self._recent = [], []
        self._start = dict(start)
        #: After the search: the samples still to measure (candidate, start, ...) and each one's scores.
        self._confirm_order: list[int] = []
        self._confirm_scores: tuple[list[float], list[float]] = ([], [])
        self._candidate: dict[str, float] = dict(start)
        tuned = [knob for knob in KNOBS if knob.name not in self._fixed]
        first = [start] + [{**point, **self._fixed} for point in SPREAD_POINTS]
        self._search = BayesianSearch(tuned, first, self._config.noise)

    def decide(self, measured: dict[str, float], score: float) -> dict[str, float]:
        """The values for the next sample, given that ``measured`` scored ``score``."""
        if not self.searching:
            return self._watch(measured, score)
        if self._confirm_order:
            return self._confirm(measured, score)
        if self._warmup > 0:
            self._warmup -= 1
            self._log.info("autotune: warming up (%d samples left)", self._warmup)
            return self._start  # after a re-initialisation the engine is back at its settings
        assert self._search is not None
        self._search.record(measured, score)
        self._write(measured, score)
        self._log.info("autotune: sample %d: %s: %.1f bytes/us", self._search.samples, describe(measured), score)
        if self._search.samples >= max(1, self._config.max_samples):
            candidate, rating = self._search.best()
            self._candidate = {**candidate, **self._fixed}
            if self._candidate == self._start:
                return self._keep(self._candidate, rating)
            # the search's pick against the values the job started with, alternately (same noise for both)
            self._confirm_order = [0, 1] * CONFIRM_PAIRS
            self._confirm_scores = ([], [])
            self._log.info("autotune: %s rated best (%.1f bytes/us); measuring it against %s", describe(candidate),
                           rating, describe(self._start))
            return self._candidate
        return {**self._search.suggest(), **self._fixed}

    def _confirm(self, measured: dict[str, float], score: float) -> dict[str, float]:
        """One sample of the confirmation; at its end, keep the pick only if it is at least as fast as the start."""
        expected = self._candidate if self._confirm_order[0] == 0 else self._start
        if measured == expected:  # else the values could not change (a rank had joined): measure it again
            self._confirm_scores[self._confirm_order.pop(0)].append(score)
        if self._confirm_order:
            return self._candidate if self._confirm_order[0] == 0 else self._start
        picked, started = (statistics.median(scores) for scores in self._confirm_scores)
        if picked >= started:
            return self._keep(self._candidate, picked)
        self._log.info("autotune: the pick measured %.1f bytes/us, the starting values %.1f", picked, started)
        return self._keep(self._start, started)

    def _keep(self, values: dict[str, float], score: float) -> dict[str, float]:
        self.best, self.best_score, self.searching = values, score, False
        self._write(values, score)
        self._log.info("autotune: best %s: %.1f bytes/us; kept from now on", describe(values), score)
        return values

    def _watch(self, measured: dict[str, float], score: float) -> dict[str, float]:
        """After the search: keep the best values, and search again when their score drops for good."""
        if self._missing or self.best_score <= 0:
            return measured
        if len(self._baseline) < DRIFT_SAMPLES:
            self._baseline.append(score)
            return self.best
        self._recent = [*self._recent, score][-DRIFT_SAMPLES:]
        baseline, recent = statistics.median(self._baseline), statistics.median(self._recent)
        if len(self._recent) == DRIFT_SAMPLES and recent < DRIFT_RATIO * baseline:
            self._log.info("autotune: %.1f bytes/us over the last %d samples, %.1f after the search: tuning again",
                           recent, DRIFT_SAMPLES, baseline)
            self.restart(self.best)
        return self.best

    def reinitialised(self, size: int, start: dict[str, float]) -> None:
        """A new initialisation (an elastic reset): search again from ``start``."""
        self._log.info("autotune: re-initialised (%d ranks): tuning again", size)
        self.restart(start)

    def _open_log(self) -> Any:
        if not self._config.log_file:
            return None
        # an elastic job's rank 0 may change hands: a later one appends to what an earlier one wrote
        mode = "a" if settings.read("ELASTIC") else "w"
        handle = open(self._config.log_file, mode, buffering=1)  # noqa: SIM115 - kept open for the job
        if handle.tell() == 0:
            handle.write(LOG_HEADER + "\n")
        return handle

    def _write(self, values: dict[str, float], score: float) -> None:
        if self._log_file is not None:
            self._log_file.write(f"0,0,{values['cycle_time_ms']:g},{values['fusion_threshold_mb']:g},{score:g},"
                                 f"{values['bucket_cap_mb']:g}\n")


def autotune_start_values() -> dict[str, float]:
    """The values a job starts with (the settings, or their defaults)."""
    return _current_values(settings.Settings.from_env())


def describe(values: dict[str, float]) -> str:
    return (f"cycle {values['cycle_time_ms']:.2f} ms, fusion {values['fusion_threshold_mb']:.1f} MB, "
            f"buckets {values['bucket_cap_mb']:.1f} MB")


class Autotuner:
    """One ``DistributedOptimizer``'s autotuning; ``after_step()`` is called by every rank after each step."""

    def __init__(self, optimizer: Any, step_bytes: int, config: AutotuneConfig) -> None:
        self._optimizer = optimizer
        self._step_bytes = step_bytes
        self.config = config
        self._runtime: Any = None
        self._decider: _Decider | None = None
        self._steps = 0
        self._joins = 0
        self._sample_started = 0.0
        self.values = autotune_start_values()
        #: (optimizer step, values applied after it): the same on every rank.
        self.history: list[tuple[int, dict[str, float]]] = []
        self._step_count = 0

    @classmethod
    def for_optimizer(cls, optimizer: Any, params: list[torch.Tensor], process_set: Any,
                      config: AutotuneConfig | None = None) -> Autotuner | None:
        """An autotuner for ``optimizer`` when ``HOROVOD_AUTOTUNE`` is on (or ``config`` is given), else None."""
        global _tuned_optimizer
        if config is None and not settings.read("AUTOTUNE"):
            return None
        if process_set.process_set_id != global_process_set.process_set_id:
            _log.warning("autotune: only an optimizer over every rank is tuned; this one is not")
            return None
        tuned = _tuned_optimizer()
        if tuned is not None and tuned is not optimizer:
            _log.warning("autotune: another DistributedOptimizer of this process is tuned already; this one is not "
                         "(the engine's values are the process's, one tuner decides them)")
            return None
        _tuned_optimizer = weakref.ref(optimizer)
        step_bytes = sum(p.numel() * p.element_size() for p in params)
        return cls(optimizer, step_bytes, config or AutotuneConfig.from_env())

    def after_step(self) -> None:
        """Count the step; at the end of a sample, agree on the next values and apply them. Collective at the
        end of a sample (the same step on every rank)."""
        runtime = context.current()
        if runtime is not self._runtime:
            self._restart(runtime)
        if runtime.joins != self._joins:  # ranks that joined took fewer steps: every rank starts a sample afresh
            self._joins, self._steps = runtime.joins, 0
        self._step_count += 1
        self._steps += 1
        if self._steps == SETTLE_STEPS:
            self._sample_started = time.perf_counter()
        if self._steps < SETTLE_STEPS + self.config.steps_per_sample:
            return
        elapsed_us = (time.perf_counter() - self._sample_started) * 1e6
        score = self._step_bytes * self.config.steps_per_sample / max(elapsed_us, 1.0)
        proposal = self._decider.decide(self.values, score) if self._decider is not None else None
        agreed = self._exchange(proposal)
        self._steps = 0
        if agreed is not None:
            self._apply(agreed)

    def _restart(self, runtime: Any) -> None:
        """First step, or the first after a re-initialisation: the engine has its configured values again."""
        first = self._runtime is None
        self._runtime = runtime
        self._steps, self._joins = 0, runtime.joins
        engine = runtime.engine.settings
        self.values = {**self.values, "cycle_time_ms": engine.cycle_time_s * 1000.0,
                       "fusion_threshold_mb": engine.fusion_threshold / MB}
        if runtime.topology.rank != 0:
            self._decider = None
        elif self._decider is None:
            self._decider = _Decider(self.config, self.values)
        elif not first:
            self._decider.reinitialised(runtime.topology.size,
                                        self._decider.best if self._decider.best_score > 0 else self.values)

    def _exchange(self, proposal: dict[str, float] | None) -> dict[str, float] | None:
        """Rank 0's values on every rank when they change, else None (also while some rank has joined)."""
        names = [knob.name for knob in KNOBS]
        # every rank adds 1 (a joined rank adds 0); rank 0 alone says whether the values change, and to what
        changed = float(proposal is not None and proposal != self.values)
        numbers = [1.0, changed, *([proposal[name] for name in names] if proposal is not None else [0.0] * len(names))]
        summed = allreduce(torch.tensor(numbers, dtype=torch.float64), name="torchring.autotune.values",
                           op=ReduceOp.SUM).tolist()
        if round(summed[0]) != context.current().topology.size or not summed[1]:
            return None
        return dict(zip(names, summed[2:], strict=True))

    def _apply(self, values: dict[str, float]) -> None:
        """Every rank, after the same step (rank 0 said they change)."""
        apply_engine_values(values)
        self._optimizer.set_bucket_cap(max(1, round(values["bucket_cap_mb"] * MB)))
        self.values = values
        self.history.append((self._step_count, dict(values)))
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("autotune: after step %d: %s", self._step_count, describe(values))


def apply_engine_values(values: dict[str, float]) -> None:
    """Give every rank's engine ``values`` (``cycle_time_ms``, ``fusion_threshold_mb``) through a tuning
    barrier: they take effect at the same place in every engine's response order. Collective."""
    tuning = EngineTuning(max(0, round(values["fusion_threshold_mb"] * MB)), values["cycle_time_ms"] / 1000.0)
    synchronize(submit(lambda name, seq: tuning.barrier_meta(seq), "barrier", None, None, full_name=TUNING_BARRIER))


def enable_autotune(optimizer: Any, config: AutotuneConfig | None = None) -> Autotuner:
    """Tune ``optimizer`` (a ``DistributedOptimizer`` over every rank) whatever ``HOROVOD_AUTOTUNE`` says, with
    ``config`` (default: the ``HOROVOD_AUTOTUNE_*`` settings). Every rank must call it for the same optimizer."""
    tuner = Autotuner.for_optimizer(optimizer, optimizer._params, optimizer._process_set,
                                    config or AutotuneConfig.from_env())
    if tuner is None:
        raise ValueError("autotune needs a DistributedOptimizer over every rank (not a process set), and tunes one "
                         "per process: another one is tuned already (HOROVOD_AUTOTUNE=1 tunes the first one built)")
    optimizer._autotuner = tuner
    return tuner
