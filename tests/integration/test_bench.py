"""``torchring bench``: real jobs on loopback gloo, their tables and JSON, and flags refused up front."""

from __future__ import annotations

import json
import os

import pytest

from torchring.bench import cli as bench_cli
from torchring.cli import main
from torchring.compat import SHIM_PATH

from .jobs import run_job, wait_until_gone

OPS = ("allreduce", "allgather", "broadcast")
BUS_FACTOR_2_RANKS = {"allreduce": 1.0, "allgather": 0.5, "broadcast": 1.0}  # 2(n-1)/n, (n-1)/n, 1 at n = 2
ALGORITHM_BYTES_2_RANKS = {"allreduce": 1, "allgather": 2, "broadcast": 1}   # allgather delivers n × size


def test_collectives_reports_both_implementations_at_every_size(tmp_path):
    out = tmp_path / "collectives.json"
    result = run_job("bench", "collectives", "-np", "2", "--sizes", "4K,64K", "--iters", "5", "--warmup", "2",
                     "--json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["mode"] == "collectives" and data["sizes"] == [4096, 65536]
    assert {(entry["op"], entry["bytes"]) for entry in data["results"]} == {
        (op, size) for op in OPS for size in (4096, 65536)}
    for entry in data["results"]:
        assert entry["iters"] == 5 and entry["warmup"] == 2
        for impl in ("torchring", "raw"):
            latency = entry[impl]["latency_ms"]
            assert latency["count"] == 5 and 0 < latency["minimum"] <= latency["median"] <= latency["maximum"]
            algbw = ALGORITHM_BYTES_2_RANKS[entry["op"]] * entry["bytes"] / (latency["median"] / 1000) / 1e9
            assert entry[impl]["algbw_gbps"] == pytest.approx(algbw)
            assert entry[impl]["busbw_gbps"] == pytest.approx(algbw * BUS_FACTOR_2_RANKS[entry["op"]])
        assert entry["ratio"] == pytest.approx(entry["torchring"]["latency_ms"]["median"]
                                               / entry["raw"]["latency_ms"]["median"])
    meta = data["meta"]
    assert meta["world_size"] == 2 and len(meta["hostnames"]) == 2
    assert meta["torch_version"] and meta["torchring_version"] and data["date"]
    # rank 0's progress, one line per operation and size and one for the burst; nothing from rank 1
    assert len(result.lines("stdout", 0)) == 7 and result.lines("stdout", 1) == []
    assert "| allgather |  64K |" in result.stdout
    burst = data["burst"]
    assert burst["count"] == 200 and burst["bytes"] == 4096
    assert burst["speedup"] == pytest.approx(burst["raw_blocking_ms"]["median"] / burst["torchring_ms"]["median"])
    assert "burst: 200 x 4K allreduce_async + synchronize" in result.stdout
    assert f"wrote {out}" in result.stdout


def test_train_compares_torchring_with_ddp_and_skips_the_horovod_shim(tmp_path):
    out = tmp_path / "train.json"
    # With torchring's own `horovod` shim on the path, `import horovod.torch` succeeds but is not Horovod.
    result = run_job("bench", "train", "-np", "2", "--model", "mlp", "--batches-per-round", "3",
                     "--warmup-batches", "1", "--rounds", "2", "--batch-size", "16", "--json", str(out),
                     env={"PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM_PATH), os.environ.get("PYTHONPATH")]))})
    assert result.returncode == 0, result.stderr
    assert "torchring bench train: starting 2 rank(s) on " in result.stderr  # said before the ranks load torch
    data = json.loads(out.read_text())
    assert list(data["frameworks"]) == ["torchring", "ddp"]
    for entry in data["frameworks"].values():
        assert len(entry["img_per_sec"]) == 2 and all(rate > 0 for rate in entry["img_per_sec"])
        assert entry["summary"]["mean"] > 0 and entry["ratio_to_ddp"] > 0
    assert data["frameworks"]["ddp"]["ratio_to_ddp"] == pytest.approx(1.0)
    assert "shim" in data["skipped"]["horovod"]
    assert data["meta"]["threads"] == 1 and data["batch_size"] == 16
    assert "| torchring |" in result.stdout and "note: horovod skipped" in result.stdout
    torchring = data["frameworks"]["torchring"]
    assert torchring["engine_cpu_ms_per_step"] > 0 and "engine ms/step" in result.stdout
    # three rounds of batches: the first step is negotiated, the lane carries the rest
    assert torchring["lane_cpu_ms_per_step"] > 0 and "lane ms/step" in result.stdout


def test_scaling_runs_one_job_per_size_and_reports_efficiency(tmp_path):
    out = tmp_path / "scaling.json"
    result = run_job("bench", "scaling", "--max-np", "2", "--batches-per-round", "2", "--warmup-batches", "1",
                     "--rounds", "2", "--batch-size", "8", "--json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["framework"] == "torchring"
    assert [run["world_size"] for run in data["runs"]] == [1, 2]
    assert data["runs"][0]["efficiency"] == pytest.approx(1.0)
    one, two = (run["summary"]["mean"] for run in data["runs"])
    assert data["runs"][1]["efficiency"] == pytest.approx(two / (2 * one))
    assert "| efficiency |" in result.stdout


def test_scaling_small_ops_measures_each_framework_in_jobs_of_its_own(tmp_path):
    out = tmp_path / "small-ops.json"
    # the horovod shim on the path: `import horovod.torch` works but is not Horovod, which is skipped
    result = run_job("bench", "scaling", "--small-ops", "--max-np", "2", "--rounds", "2", "--json", str(out),
                     env={"PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM_PATH), os.environ.get("PYTHONPATH")]))})
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["mode"] == "scaling-small-ops" and list(data["runs"]) == ["2"]
    assert "compatibility shim" in data["skipped"]["horovod"]
    for size, runs in data["runs"].items():
        assert set(runs) == {"torchring", "c10d"}
        for name, run in runs.items():
            assert run["framework"] == name and run["world_size"] == int(size)
            assert run["init_s"] > 0 and run["latency_ms"] > 0 and run["burst_ms"] > 0
        steps = runs["torchring"]["init_steps_s"]
        assert {"store", "rendezvous", "control group", "data group", "waker", "engine"} <= set(steps)
    assert "one blocking 4 KB allreduce, ms:" in result.stdout and "torchring ÷ c10d" in result.stdout
    assert "torchring init() on rank 0, ms per step" in result.stdout


def test_failed_job_is_reported_and_leaves_nothing_behind(tmp_path):
    # An invalid torchring setting makes torchring.init() fail on every rank.
    result = run_job("bench", "collectives", "-np", "2", "--sizes", "4K", "--iters", "1",
                     "--json", str(tmp_path / "never.json"), env={"TORCHRING_CYCLE_TIME": "-1"})
    assert result.returncode != 0
    assert "torchring bench: error: the collectives benchmark job (2 ranks) failed" in result.stderr
    assert not (tmp_path / "never.json").exists()
    assert wait_until_gone(result.marker) == []


@pytest.mark.parametrize("args,message", [
    (["collectives", "-np", "2", "--sizes", "4K,4Q"], "'4Q' is not a size"),
    (["collectives", "-np", "2", "--sizes", "6"], "multiple of 4 bytes"),
    (["collectives", "-np", "0"], "-np must be at least 1"),
    (["collectives", "-np", "2", "--ops", "allreduce,scatter"], "unknown name 'scatter'"),
    (["collectives", "-np", "3", "-H", "localhost:2"], "more ranks than the 2 slots"),
    (["collectives", "-np", "1", "-H", "localhost:x"], "positive integer"),
    (["train", "-np", "2", "--frameworks", "jax"], "unknown name 'jax'"),
    (["train", "-np", "2", "--rounds", "0"], "--rounds must be at least 1"),
    (["train", "-np", "2", "--threads", "0"], "--threads must be at least 1"),
    (["train", "-np", "1", "--json", "/no/such/dir/out.json"], "does not exist"),
    (["scaling", "--max-np", "0"], "--max-np must be at least 1"),
    (["scaling", "--max-np", "3", "-H", "localhost:2"], "more ranks than the 2 slots"),
    (["scaling", "--small-ops", "--max-np", "1"], "--max-np must be at least 2"),
])
def test_bad_flags_are_a_one_line_usage_error_before_any_rank_starts(args, message, monkeypatch, capsys):
    def no_job(config):
        raise AssertionError(f"a job was started: {config}")

    monkeypatch.setattr(bench_cli, "run_job", no_job)
    assert main(["bench", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("torchring bench: error: ") and message in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""


@pytest.mark.parametrize("args,message", [
    (["train", "-np", "2", "--model", "vgg"], "invalid choice: 'vgg'"),
    (["collectives", "-np", "2", "--sizes", "4Q"], "torchring bench: error: --sizes: '4Q' is not a size"),
])
def test_usage_errors_exit_with_code_2_from_the_command(args, message, monkeypatch, capsys):
    # what `torchring bench` exits with: main's return value, or argparse's own exit for a bad choice
    def no_job(config):
        raise AssertionError(f"a job was started: {config}")

    monkeypatch.setattr(bench_cli, "run_job", no_job)
    try:
        code = main(["bench", *args])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
