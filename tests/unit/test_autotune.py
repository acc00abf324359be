"""The autotuner's parts that need no ranks: the Bayesian search, rank 0's decisions and its CSV log, the
settings it reads, and the tuning barrier that carries the engine's values."""

from __future__ import annotations

import csv
import math

from torchring.optim import autotune
from torchring.optim.autotune import LOG_HEADER, AutotuneConfig, _Decider
from torchring.optim.bayes_search import BayesianSearch, Knob
from torchring.runtime.coordination.engine_settings import EngineSettings
from torchring.runtime.coordination.fusion import BatchPlanner
from torchring.runtime.coordination.tuning import TUNING_BARRIER, EngineTuning, tuning_from
from torchring.runtime.requests import OpType, RequestMeta

KNOBS = [Knob("a", 1.0, 100.0), Knob("b", 0.5, 20.0)]


def _peaked(point: dict[str, float]) -> float:
    """A smooth score with its maximum at a=30, b=2 (on the log scale the search uses)."""
    return -((math.log(point["a"] / 30.0)) ** 2) - (math.log(point["b"] / 2.0)) ** 2


def test_the_search_measures_the_given_points_first_then_improves_on_them():
    first = [{"a": 1.0, "b": 20.0}, {"a": 100.0, "b": 0.5}]
    search = BayesianSearch(KNOBS, first, noise=0.01, seed=3)
    for index in range(14):
        point = search.suggest()
        if index < 2:
            assert point == first[index]
        assert all(knob.low <= point[knob.name] <= knob.high for knob in KNOBS)
        search.record(point, _peaked(point))
    best, score = search.best()
    assert score > max(_peaked(point) for point in first) + 1.0, (best, score)
    assert 10.0 < best["a"] < 90.0 and 0.7 < best["b"] < 6.0, best


def test_the_search_is_the_same_for_the_same_seed():
    runs = []
    for _ in range(2):
        search = BayesianSearch(KNOBS, [{"a": 5.0, "b": 5.0}], noise=0.5, seed=11)
        for _ in range(6):
            point = search.suggest()
            search.record(point, _peaked(point))
        runs.append(search.best())
    assert runs[0] == runs[1]


def _values(cycle: float = 1.0, fusion: float = 128.0, bucket: float = 25.0) -> dict[str, float]:
    return {"cycle_time_ms": cycle, "fusion_threshold_mb": fusion, "bucket_cap_mb": bucket}


def test_rank_0_warms_up_searches_logs_each_sample_and_keeps_the_best(tmp_path):
    log = tmp_path / "tune.csv"
    decider = _Decider(AutotuneConfig(str(log), warmup_samples=2, steps_per_sample=5, max_samples=4), _values())
    measured, scores = _values(), [5.0, 9.0, 3.0, 4.0]
    assert decider.decide(measured, 1.0) == measured and decider.decide(measured, 1.0) == measured  # warm-up
    tried = []
    for score in scores:
        tried.append(measured)
        measured = decider.decide(measured, score)
    # the second point is rated best; it is measured against the starting values, alternately, and wins
    assert decider.searching and measured == tried[1]
    for _ in range(autotune.CONFIRM_PAIRS):
        assert decider.decide(measured, 9.0) == _values()
        measured = decider.decide(_values(), 5.0)
    assert not decider.searching and measured == tried[1] == decider.best
    assert tried[0] == _values() and tried[1] == {**autotune.SPREAD_POINTS[0]}
    rows = list(csv.reader(log.open()))
    assert rows[0] == LOG_HEADER.split(",") and len(rows) == 1 + len(scores) + 1
    assert [float(row[4]) for row in rows[1:-1]] == scores
    # the last line: the kept values, with their median score in the confirmation
    assert rows[-1][:2] == ["0", "0"] and float(rows[-1][2]) == tried[1]["cycle_time_ms"]
    assert float(rows[-1][4]) == 9.0


def test_a_pick_slower_than_the_starting_values_is_not_kept():
    decider = _Decider(AutotuneConfig(None, warmup_samples=0, max_samples=2), _values())
    pick = decider.decide(_values(), 5.0)  # the start, then the first spread point scores higher by luck
    measured = decider.decide(pick, 8.0)
    assert measured == pick != _values()
    for _ in range(autotune.CONFIRM_PAIRS):  # measured again, the pick is slower than the start
        assert decider.decide(measured, 4.0) == _values()
        measured = decider.decide(_values(), 6.0)
    assert not decider.searching and decider.best == measured == _values()


def test_after_the_search_a_lasting_drop_starts_a_new_one_and_noise_does_not():
    decider = _Decider(AutotuneConfig(None, warmup_samples=0, max_samples=1), _values())
    best = decider.decide(_values(), 10.0)
    assert not decider.searching
    baseline, noisy = [10.0, 9.0, 11.0, 10.0, 10.0], [4.0, 12.0, 5.0, 11.0, 13.0, 4.0, 10.0]
    for score in baseline + noisy:  # one-off dips: the median holds
        assert decider.decide(best, score) == best and not decider.searching
    drops = 0
    while not decider.searching:
        decider.decide(best, 5.0)
        drops += 1
    assert drops <= autotune.DRIFT_SAMPLES


def test_knobs_set_explicitly_are_not_tuned():
    config = AutotuneConfig.from_env({"HOROVOD_CYCLE_TIME": "3", "TORCHRING_BUCKET_CAP_MB": "8"})
    assert dict(config.fixed) == {"cycle_time_ms": 3.0, "bucket_cap_mb": 8.0}
    decider = _Decider(AutotuneConfig(None, warmup_samples=0, max_samples=6, fixed=config.fixed),
                       _values(3.0, 128.0, 8.0))
    point = _values(3.0, 128.0, 8.0)
    for score in range(6):
        point = decider.decide(point, float(score))
        assert point["cycle_time_ms"] == 3.0 and point["bucket_cap_mb"] == 8.0


def test_the_tuning_barrier_carries_the_engine_values_and_plain_barriers_carry_none():
    tuning = EngineTuning(fusion_threshold=32 * 1024 * 1024, cycle_time_s=0.0025)
    meta = tuning.barrier_meta(seq=7)
    assert meta.name == TUNING_BARRIER and meta.op_type is OpType.BARRIER and tuning_from(meta) == tuning
    assert tuning_from(RequestMeta(name="barrier", op_type=OpType.BARRIER)) is None
    applied = tuning.applied_to(EngineSettings())
    assert (applied.fusion_threshold, applied.cycle_time_s) == (32 * 1024 * 1024, 0.0025)


def test_a_new_threshold_replans_even_the_responses_planned_before():
    planner = BatchPlanner(1024)
    planner._last = ((1, 2), [], [["stale"]])  # a remembered plan for the same responses
    planner.set_threshold(0)
    assert planner._last is None and planner.threshold == 0
