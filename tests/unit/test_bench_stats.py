"""``torchring bench``'s pure parts: sizes, statistics, bandwidths, iteration schedule, tables, options, models."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from torchring.bench import report
from torchring.bench.cli import BenchUsageError, add_bench_arguments, collectives_options, train_options
from torchring.bench.collectives import MAX_ITERS, MIN_ITERS, schedule
from torchring.bench.models import MODELS, build_model, input_shape
from torchring.bench.options import MODEL_NAMES, CollectivesOptions, TrainOptions, decode, encode
from torchring.bench.results import read_json, write_json_atomic
from torchring.bench.sizes import DEFAULT_SIZES, format_size, parse_size, parse_sizes
from torchring.bench.stats import Summary, algbw, bus_factor, busbw, ci95_half_width, t_quantile_975

# -- sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,size", [("4096", 4096), ("4K", 4096), ("4k", 4096), ("4KB", 4096), ("4KiB", 4096),
                                       ("1M", 1024**2), ("256MB", 256 * 1024**2), ("1G", 1024**3), (" 8 ", 8)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text,message", [("4Q", "not a size"), ("", "not a size"), ("-4K", "not a size"),
                                          ("1.5M", "not a size"), ("6", "multiple of 4"), ("0", "multiple of 4")])
def test_parse_size_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_size(text)


def test_parse_sizes_keeps_order_and_drops_repeats():
    assert parse_sizes("64K,4K,4096,1M,") == [65536, 4096, 1024**2]
    with pytest.raises(ValueError, match="no sizes"):
        parse_sizes(" , ")


def test_format_size_round_trips_and_default_sizes_are_powers_of_four():
    assert [format_size(s) for s in DEFAULT_SIZES] == ["4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M", "256M"]
    assert format_size(1000) == "1000" and format_size(3 * 1024**3) == "3G"
    assert all(parse_size(format_size(s)) == s for s in (4, 1000, 4096, 6 * 1024**2))


# -- statistics and bandwidth ----------------------------------------------------------------------


def test_summary_and_t_based_interval():
    summary = Summary.of([1.0, 2.0, 3.0])
    assert (summary.count, summary.mean, summary.median, summary.minimum, summary.maximum) == (3, 2.0, 2.0, 1.0, 3.0)
    assert summary.stdev == pytest.approx(1.0)
    assert summary.ci95 == pytest.approx(4.303 / math.sqrt(3))
    assert Summary.of([5.0]).ci95 is None and Summary.of([5.0]).stdev == 0.0
    assert json.loads(json.dumps(summary.to_dict()))["median"] == 2.0
    with pytest.raises(ValueError):
        Summary.of([])


def test_t_quantiles_approach_the_normal_one():
    assert t_quantile_975(1) == pytest.approx(12.706)
    assert t_quantile_975(9) == pytest.approx(2.262)
    assert t_quantile_975(1000) == pytest.approx(1.96)
    assert ci95_half_width([2.0, 2.0, 2.0]) == 0.0
    with pytest.raises(ValueError):
        t_quantile_975(0)


@pytest.mark.parametrize("op,n,factor", [("allreduce", 2, 1.0), ("allreduce", 4, 1.5), ("allreduce", 1, 0.0),
                                         ("allgather", 2, 0.5), ("allgather", 4, 0.75), ("broadcast", 8, 1.0)])
def test_bus_factor(op, n, factor):
    assert bus_factor(op, n) == pytest.approx(factor)


def test_algbw_and_busbw():
    mb = 1024**2
    assert algbw("allreduce", mb, 4, 0.5) == pytest.approx(2 * mb)
    assert busbw("allreduce", mb, 4, 0.5) == pytest.approx(2 * mb * 1.5)
    assert algbw("allgather", mb, 4, 0.5) == pytest.approx(8 * mb)  # the gathered 4 MiB in 0.5 s
    assert busbw("allgather", mb, 4, 0.5) == pytest.approx(6 * mb)
    assert busbw("broadcast", mb, 4, 0.5) == algbw("broadcast", mb, 4, 0.5) == pytest.approx(2 * mb)
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor("scatter", 2)


def test_schedule_uses_fewer_iterations_for_larger_sizes():
    iterations = [schedule(size)[1] for size in DEFAULT_SIZES]
    assert iterations == sorted(iterations, reverse=True)
    assert iterations[0] == MAX_ITERS and iterations[-1] == MIN_ITERS
    assert all(1 <= schedule(size)[0] <= 5 for size in DEFAULT_SIZES)
    assert schedule(256 * 1024**2, iters=7, warmup=0) == (0, 7)


# -- tables ----------------------------------------------------------------------------------------


def test_markdown_table_aligns_columns():
    table = report.markdown_table(["name", "value"], [["a", "1.5"], ["longer", "10.25"]], [False, True])
    assert table.splitlines() == [
        "| name   | value |",
        "|--------|------:|",
        "| a      |   1.5 |",
        "| longer | 10.25 |",
    ]
    with pytest.raises(ValueError):
        report.markdown_table(["a", "b"], [["only one"]])


def _latency(median: float) -> dict:
    return Summary.of([median]).to_dict()


def test_collectives_table():
    result = {"results": [{"op": "allreduce", "bytes": 4096, "iters": 50, "ratio": 2.0,
                           "torchring": {"latency_ms": _latency(0.5), "algbw_gbps": 0.008, "busbw_gbps": 0.008},
                           "raw": {"latency_ms": _latency(0.25), "algbw_gbps": 0.016, "busbw_gbps": 0.016}}]}
    lines = report.collectives_table(result).splitlines()
    assert lines[0].split("|")[1:4] == [" op        ", " size ", " iters "]
    cells = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    assert cells == ["allreduce", "4K", "50", "0.500", "0.250", "2.00", "0.008", "0.008", "0.016", "0.016"]


def test_train_and_scaling_tables():
    train = {"meta": {"world_size": 2}, "frameworks": {
        "torchring": {"summary": Summary.of([90.0, 110.0]).to_dict(), "ratio_to_ddp": 0.5,
                      "ratio_to_ddp_per_round": Summary.of([0.45, 0.55]).to_dict(), "engine_cpu_ms_per_step": 0.25,
                      "lane_cpu_ms_per_step": 0.125, "lane_copies_ms_per_step": 0.5},
        "ddp": {"summary": Summary.of([200.0, 200.0]).to_dict(), "ratio_to_ddp": 1.0,
                "ratio_to_ddp_per_round": Summary.of([1.0, 1.0]).to_dict()}}}
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in report.train_table(train).splitlines()[2:]]
    assert rows[0][:5] == ["torchring", "100.0", "127.1", "50.0", "0.50"] and rows[0][6:] == ["0.250", "0.125", "0.500"]
    assert rows[1] == ["ddp", "200.0", "0.0", "100.0", "1.00", "", "", "", ""]
    # with Horovod in the job: a ratio to it too, after the ratio to DDP
    train["frameworks"]["horovod"] = {"summary": Summary.of([80.0, 80.0]).to_dict(), "ratio_to_ddp": 0.4,
                                      "ratio_to_horovod": 1.0}
    train["frameworks"]["torchring"]["ratio_to_horovod"] = 1.25
    lines = report.train_table(train).splitlines()
    assert [cell.strip() for cell in lines[0].split("|")[1:-1]][4:8] == ["vs ddp", "± 95%", "vs horovod", "± 95%"]
    assert [cell.strip() for cell in lines[2].split("|")[1:-1]][6] == "1.25"
    scaling = {"runs": [{"world_size": 1, "summary": Summary.of([100.0]).to_dict(), "efficiency": 1.0},
                        {"world_size": 2, "summary": Summary.of([150.0]).to_dict(), "efficiency": 0.75}]}
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in report.scaling_table(scaling).splitlines()[2:]]
    assert rows == [["1", "100.0", "n/a", "100.0", "1.00"], ["2", "150.0", "n/a", "75.0", "0.75"]]
    assert report.notes({"skipped": {"horovod": "not installed"}}) == ["note: horovod skipped: not installed"]


# -- options, flags, result files, models ----------------------------------------------------------


def test_options_round_trip_through_the_worker_argument():
    options = CollectivesOptions(("allreduce",), (4096, 65536), iters=3)
    assert decode("collectives", encode(options, "/tmp/r.json")) == (options, "/tmp/r.json")
    train = TrainOptions(model="convnet", frameworks=("ddp",))
    assert decode("train", encode(train, "x")) == (train, "x")
    with pytest.raises(ValueError, match="unknown benchmark mode"):
        decode("other", encode(train, "x"))


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(argv)


def test_flags_become_checked_options():
    options = collectives_options(_parse("collectives", "-np", "2", "--sizes", "4K,1M", "--ops", "broadcast"))
    assert options == CollectivesOptions(("broadcast",), (4096, 1024**2), None, None)
    assert collectives_options(_parse("collectives", "-np", "2")).sizes == DEFAULT_SIZES
    train = train_options(_parse("train", "-np", "2", "--model", "resnet", "--threads", "2"), ("torchring",))
    assert (train.model, train.threads, train.frameworks) == ("resnet", 2, ("torchring",))
    with pytest.raises(BenchUsageError, match="--sizes: '1X' is not a size"):
        collectives_options(_parse("collectives", "-np", "2", "--sizes", "1X"))
    with pytest.raises(BenchUsageError, match="--iters must be at least 1"):
        collectives_options(_parse("collectives", "-np", "2", "--iters", "0"))
    with pytest.raises(BenchUsageError, match="--batch-size must be at least 1"):
        train_options(_parse("train", "-np", "2", "--batch-size", "0"), ("ddp",))


def test_write_json_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"b": [1, 2]})
    assert read_json(path) == {"b": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_the_command_lines_model_names_are_the_models():
    assert tuple(MODELS) == MODEL_NAMES


@pytest.mark.parametrize("name", list(MODELS))
def test_models_give_ten_logits(name):
    torch.manual_seed(0)
    model = build_model(name)
    assert model(torch.randn(2, *input_shape(name))).shape == (2, 10)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vgg")


def test_mlp_and_convnet_have_the_documented_layers():
    assert sum(p.numel() for p in build_model("mlp").parameters()) == 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 10250
    convnet = build_model("convnet")
    assert convnet.fc1.in_features == 9216 and convnet.conv2.out_channels == 64
