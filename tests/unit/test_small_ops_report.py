"""``torchring bench scaling --small-ops``: the job sizes, the alternating order, and the tables."""

from __future__ import annotations

from torchring.bench.options import SmallOpsOptions
from torchring.bench.small_ops import job_sizes, run_jobs, small_ops_table


def test_job_sizes_double_up_to_the_largest():
    assert job_sizes(32) == [2, 4, 8, 16, 32]
    assert job_sizes(12) == [2, 4, 8, 12]
    assert job_sizes(2) == [2]


def _fake_launch(calls):
    def launch(options: SmallOpsOptions, size: int) -> dict:
        calls.append((options.framework, size))
        if options.framework == "horovod":
            return {"framework": "horovod", "world_size": size, "skipped": "not installed"}
        run = {"framework": options.framework, "world_size": size, "init_s": size * (2.0 if options.framework ==
               "torchring" else 1.0), "latency_ms": 1.0, "burst_ms": 10.0}
        if options.framework == "torchring":
            run["init_steps_s"] = {"store": 0.001, "control group": 0.5}
        return run
    return launch


def test_frameworks_alternate_and_a_skipped_one_is_not_tried_again():
    calls: list[tuple[str, int]] = []
    result = run_jobs([2, 4, 8], _fake_launch(calls), SmallOpsOptions(latency_rounds=3, burst_rounds=2))
    assert calls == [("torchring", 2), ("c10d", 2), ("horovod", 2), ("c10d", 4), ("torchring", 4),
                     ("torchring", 8), ("c10d", 8)]
    assert result["skipped"] == {"horovod": "not installed"}
    table = small_ops_table(result)
    assert "init(), from the last rank's call to the first barrier, s:" in table
    assert "|     4 |      8.00 | 4.00 |       - |             2.00 |                   - |" in table
    assert "| store | control group |" in table
