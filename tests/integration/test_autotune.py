"""``--autotune`` on real ranks: a ``horovodrun`` job line with the autotuner's flags runs unchanged, writes
Horovod's CSV log, every rank applies the same values after the same step (and so fuses alike), a
re-initialisation starts a new search, and a joined rank freezes the values."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from .jobs import ROOT, SCRIPTS

HOROVOD_LINE = ("--autotune", "--autotune-log-file", "{log}", "--disable-cache", "--gloo-timeout-seconds", "60",
               "--prefix-output-with-timestamp")


def test_a_horovod_autotune_job_line_tunes_every_rank_alike(tmp_path):
    log = tmp_path / "tune.csv"
    flags = [flag.format(log=log) for flag in HOROVOD_LINE]
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HOROVOD_LOG_LEVEL": "info"}
    result = subprocess.run([str(bin_dir / "horovodrun"), "-np", "2", "-H", "localhost:2", *flags,
                             "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "3",
                             "--autotune-bayes-opt-max-samples", "6", "python", str(SCRIPTS / "autotune_job.py"),
                             str(tmp_path / "ranks")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"ranks.{rank}.json").read_text()) for rank in (0, 1)]

    # every value applied after the same step on both ranks, and the engines agree after every step
    for phase in ("first", "reinitialised", "after the join"):
        assert ranks[0]["engine"][phase] == ranks[1]["engine"][phase], phase
    assert ranks[0]["digest"] == ranks[1]["digest"] and ranks[0]["buckets"] == ranks[1]["buckets"]
    distinct = {tuple(values) for values in ranks[0]["engine"]["first"]}
    assert len(distinct) >= 3, distinct  # it did move the engine's knobs
    # values applied after the same optimizer steps, but for the steps rank 0 took alone; some after the join
    alone = len(ranks[0]["engine"]["rank 1 joined"])
    before_join = len(ranks[0]["engine"]["first"]) + len(ranks[0]["engine"]["reinitialised"])
    shifted = [[step - alone if step > before_join + alone else step, values] for step, values in ranks[0]["history"]]
    assert shifted == ranks[1]["history"]  # and the exchanges after the join met (no rank hung)

    # Horovod's CSV columns (then the bucket size): 6 scored samples, then the best, per search (two searches)
    rows = list(csv.DictReader(log.open()))
    assert list(rows[0]) == ["hierarchical_allreduce", "hierarchical_allgather", "cycle_time_ms",
                             "tensor_fusion_threshold", "score", "bucket_cap_mb"]
    assert len(rows) >= 7 and all(float(row["score"]) > 0 for row in rows), rows
    best, scores = rows[6], [float(row["score"]) for row in rows[:6]]
    knobs = ("cycle_time_ms", "tensor_fusion_threshold", "bucket_cap_mb")
    # the best values are among the sampled ones; their score is the median of the confirmation's samples,
    # measured later, so it may fall below every search sample's on a noisy machine (it did: 79.8 < 80.4)
    assert any(all(row[k] == best[k] for k in knobs) for row in rows[:6]) and float(best["score"]) > 0
    assert all(score > 0 for score in scores)
    output = result.stdout + result.stderr  # horovodrun's timestamped layout prints both streams to stdout
    assert "autotune: best" in output and "re-initialised (2 ranks): tuning again" in output, output[-4000:]

    # while rank 1 had joined, rank 0's steps applied nothing new
    joined_steps = ranks[0]["engine"]["rank 1 joined"]
    assert joined_steps and len(set(map(tuple, joined_steps))) == 1, joined_steps
