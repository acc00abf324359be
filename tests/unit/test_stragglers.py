"""The launcher's straggler watch on synthetic step records, and its Prometheus gauges."""

from __future__ import annotations

import random

import torch.distributed as dist
from prometheus_client import CollectorRegistry, generate_latest

from torchring.launch.watch.stragglers import StragglerWatch, parse_steps
from torchring.metrics.exporter import JobCollector, straggler_families
from torchring.store_auth import AuthenticatedStore, JobCredentials


def job_steps(work_s: dict[int, float], steps: int = 100, first: int = 0, jitter_s: float = 0.002,
              seed: int = 0) -> dict[int, dict]:
    """Each rank's ``steps`` for a job whose reductions end together: a rank waits for the slowest one."""
    rng = random.Random(seed)
    waits: dict[int, list[float]] = {rank: [] for rank in work_s}
    intervals: dict[int, list[float | None]] = {rank: [] for rank in work_s}
    for index in range(steps):
        work = {rank: base + rng.uniform(0, jitter_s) for rank, base in work_s.items()}
        slowest = max(work.values())
        for rank in work_s:
            waits[rank].append(slowest - work[rank] + 0.0002)
            intervals[rank].append(None if index == 0 else slowest + 0.0002)
    return {rank: {"first": first, "wait": waits[rank], "interval": intervals[rank]} for rank in work_s}


def watch() -> tuple[StragglerWatch, list[str]]:
    logged: list[str] = []
    return StragglerWatch(logged.append), logged


def test_a_clear_straggler_is_named_once_with_its_lag():
    straggler, logged = watch()
    steps = job_steps({0: 0.100, 1: 0.141, 2: 0.100, 3: 0.101})
    straggler.update(steps)
    straggler.update(steps)
    assert len(logged) == 1, logged
    assert logged[0].startswith("rank 1 is a straggler: the last to reach the gradient reductions in 100 of the "
                                "last 100 steps, 4")  # ~40 ms behind
    assert "ms behind the others per step (its steps take 4" in logged[0]  # ~40% longer
    assert straggler.warned == {1}
    gauges = straggler.gauges()
    assert set(gauges) == {0, 1, 2, 3}
    lag, fraction = gauges[1]
    assert 0.035 < lag < 0.045 and fraction == 1.0
    assert gauges[0][1] == gauges[2][1] == gauges[3][1] == 0.0


def test_balanced_ranks_are_not_stragglers():
    straggler, logged = watch()
    straggler.update(job_steps({0: 0.100, 1: 0.100, 2: 0.100}, jitter_s=0.02))
    assert logged == []
    fractions = [fraction for _, fraction in straggler.gauges().values()]
    assert abs(sum(fractions) - 1.0) < 1e-9 and max(fractions) < 0.8


def test_last_every_step_but_barely_slower_is_not_a_straggler():
    straggler, logged = watch()
    straggler.update(job_steps({0: 0.100, 1: 0.110}, jitter_s=0.001))  # 10% slower: under slow_ratio 1.2
    assert logged == [] and straggler.gauges()[1][1] == 1.0


def test_too_few_steps_name_nobody():
    straggler, logged = watch()
    straggler.update(job_steps({0: 0.1, 1: 0.3}, steps=19))
    assert logged == []
    assert straggler.gauges()[1][1] == 1.0  # the gauges are there all the same


def test_only_steps_every_rank_has_count():
    straggler, logged = watch()
    steps = job_steps({0: 0.1, 1: 0.3}, steps=100)
    steps[0] = {**steps[0], "first": 90}  # rank 0's file holds steps 90..189: ten in common
    straggler.update(steps)
    assert logged == []
    steps = job_steps({0: 0.1, 1: 0.3}, steps=100)
    straggler.update({0: steps[0], 1: steps[1], 2: None})  # a rank without steps yet
    assert logged == []
    straggler.update({0: steps[0], 1: steps[1]})
    assert len(logged) == 1 and logged[0].startswith("rank 1 is a straggler")


def test_malformed_steps_are_ignored():
    assert parse_steps(None) == {} and parse_steps([1, 2]) == {} and parse_steps({"first": "0", "wait": [1]}) == {}
    assert parse_steps({"first": True, "wait": [1.0]}) == {}
    assert parse_steps({"first": 5, "wait": [0.1, "x", -1, float("nan"), 0.2], "interval": [None, 1, 2]}) == {
        5: (0.1, None), 9: (0.2, None)}
    straggler, logged = watch()
    straggler.update({0: {"first": 0, "wait": "nope"}, 1: {"interval": []}, "2": {}, 2.5: {}})
    assert logged == [] and set(straggler.gauges()) == {0, 1}


def test_gauges_become_prometheus_families_on_the_launchers_endpoint():
    straggler, _ = watch()
    straggler.update(job_steps({0: 0.10, 1: 0.15}))
    assert [family.name for family in straggler_families(straggler.gauges())] == [
        "torchring_straggler_lag_seconds", "torchring_straggler_last_fraction"]
    assert list(straggler_families({})) == []
    registry = CollectorRegistry()
    registry.register(JobCollector(AuthenticatedStore(dist.HashStore(), JobCredentials.new()), 2, straggler.gauges))
    text = generate_latest(registry).decode()
    assert 'torchring_straggler_last_fraction{rank="1"} 1.0' in text
    assert 'torchring_straggler_last_fraction{rank="0"} 0.0' in text
    lag = next(line for line in text.splitlines() if line.startswith('torchring_straggler_lag_seconds{rank="1"}'))
    assert 0.045 < float(lag.split()[-1]) < 0.055
    plain = CollectorRegistry()
    # without a watch: as before
    plain.register(JobCollector(AuthenticatedStore(dist.HashStore(), JobCredentials.new()), 2))
    assert "straggler" not in generate_latest(plain).decode()
