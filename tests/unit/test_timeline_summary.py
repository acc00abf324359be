"""``torchring timeline summarize`` on hand-written traces (timestamps in µs, as the writer records them)."""

from __future__ import annotations

import json

import pytest

from torchring.diagnostics.timeline.cli import main
from torchring.diagnostics.timeline.report import format_summary, plot, summary_to_dict
from torchring.diagnostics.timeline.summary import load_trace, summarize

# ---- building traces ------------------------------------------------------------------------------


def name(pid: int, tensor: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": tensor}}


def begin(pid: int, label: str, ts: float) -> dict:
    return {"name": label, "ph": "B", "ts": ts, "pid": pid, "tid": 1}


def end(pid: int, ts: float, args: dict | None = None) -> dict:
    event = {"ph": "E", "ts": ts, "pid": pid, "tid": 1}
    if args is not None:
        event["args"] = args
    return event


def instant(pid: int, label: str, ts: float, args: dict | None = None) -> dict:
    event = {"name": label, "ph": "i", "s": "p", "ts": ts, "pid": pid, "tid": 1}
    if args is not None:
        event["args"] = args
    return event


def cycle(ts: float) -> dict:
    return {"name": "CYCLE_START", "ph": "i", "s": "g", "ts": ts, "pid": 0, "tid": 0}


def negotiation(pid: int, ready: dict[int, float], op: str = "ALLREDUCE") -> list[dict]:
    """A NEGOTIATE span from the first rank ready to the last, with one instant per rank."""
    times = sorted(ready.values())
    return [begin(pid, f"NEGOTIATE_{op}", times[0]),
            *[instant(pid, str(rank), ts) for rank, ts in sorted(ready.items(), key=lambda item: item[1])],
            end(pid, times[-1] + 10)]


def operation(pid: int, start: float, stop: float, backend: float | None = None, op: str = "ALLREDUCE",
              dtype: str = "float32", shape: str = "[10]") -> list[dict]:
    """An unfused operation span whose backend activity lasts ``backend`` µs (the whole span by default)."""
    backend = stop - start - 2 if backend is None else backend
    return [begin(pid, op, start), begin(pid, f"GLOO_{op}", start + 1), end(pid, start + 1 + backend),
            end(pid, stop, {"dtype": dtype, "shape": shape})]


def write_trace(path, events: list[dict]) -> None:
    path.write_text("[\n" + ",\n".join(json.dumps(event) for event in events) + "\n]")


# ---- top tensors -------------------------------------------------------------------------------------


def test_top_tensors_by_operation_time():
    events = [name(1, "allreduce.a"), name(2, "allreduce.b"),
              *negotiation(1, {0: 0, 1: 2_000}), *operation(1, 3_000, 13_000, backend=8_000),
              *negotiation(2, {0: 14_000, 1: 14_100}), *operation(2, 15_000, 65_000, dtype="float16",
                                                                   shape="[4, 4]"),
              *operation(1, 70_000, 90_000, backend=15_000)]
    summary = summarize(events)
    assert [t.name for t in summary.tensors] == ["allreduce.b", "allreduce.a"]
    b, a = summary.tensors
    assert (a.ops, a.total_s, a.mean_s, a.backend_s) == (2, pytest.approx(0.030), pytest.approx(0.015),
                                                         pytest.approx(0.023))
    assert a.negotiation_s == pytest.approx(0.00201)
    assert a.total_bytes == 2 * 10 * 4
    assert (b.ops, b.total_s, b.total_bytes) == (1, pytest.approx(0.050), 4 * 4 * 2)
    assert summary.ops == 3 and summary.open_spans == 0
    text = format_summary(summary, top=1)
    assert "Top 1 tensors by communication time" in text
    assert "allreduce.b" in text and "allreduce.a" not in text
    header = next(line for line in text.splitlines() if line.startswith("tensor"))
    row = next(line for line in text.splitlines() if line.startswith("allreduce.b"))
    assert header.index("total ms") + len("total ms") == row.index("50.00") + len("50.00")  # right-aligned


def test_element_sizes_of_common_dtypes():
    events = [name(1, "x"), *operation(1, 0, 10, dtype="bfloat16", shape="[3]"),
              name(2, "y"), *operation(2, 20, 30, dtype="int64", shape="[2, 2]"),
              name(3, "z"), *operation(3, 40, 50, dtype="bool", shape="[]"),
              name(4, "w"), *operation(4, 60, 70, dtype="mystery", shape="[5]")]
    sizes = {t.name: t.total_bytes for t in summarize(events).tensors}
    assert sizes == {"x": 6, "y": 32, "z": 1, "w": None}


# ---- fusion -----------------------------------------------------------------------------------------


def fused_batch(pids: list[int], start: float, shape: str, dtype: str = "float32",
                interleave: list[dict] | None = None) -> list[dict]:
    """What Executor._launch_fused writes: every op, then MEMCPY_IN on all, then the backend on all, ..."""
    events = [begin(pid, "ALLREDUCE", start + i) for i, pid in enumerate(pids)]
    memcpy = [begin(pid, "MEMCPY_IN_FUSION_BUFFER", start + 10 + i) for i, pid in enumerate(pids)]
    events += memcpy[:1] + (interleave or []) + memcpy[1:]
    for i, pid in enumerate(pids):
        events += [end(pid, start + 20 + i), begin(pid, "GLOO_ALLREDUCE", start + 20 + i)]
    for i, pid in enumerate(pids):
        events += [end(pid, start + 100 + i), begin(pid, "MEMCPY_OUT_FUSION_BUFFER", start + 100 + i)]
    events += [end(pid, start + 110 + i) for i, pid in enumerate(pids)]
    events += [end(pid, start + 120 + i, {"dtype": dtype, "shape": shape}) for i, pid in enumerate(pids)]
    return events


def test_fusion_batches_are_runs_of_memcpy_in():
    lane_pid = 9
    interleave = [name(lane_pid, "bucket.0.w"), begin(lane_pid, "ALLREDUCE", 1_011),
                  begin(lane_pid, "GLOO_ALLREDUCE", 1_012)]
    events = [*[name(pid, f"t{pid}") for pid in range(1, 7)],
              *fused_batch([1, 2, 3], 1_000, "[10]", interleave=interleave),  # 3 x 40 B
              *fused_batch([4, 5], 1_200, "[4, 4]", dtype="float16"),  # 2 x 32 B, right after the first
              end(lane_pid, 1_500), end(lane_pid, 1_501, {"dtype": "float32", "shape": "[7]"}),
              *operation(6, 2_000, 2_100)]
    fusion = summarize(events).fusion
    assert fusion.buffers == 2
    assert fusion.fused_tensors == 5
    assert (fusion.mean_tensors, fusion.max_tensors) == (2.5, 3)
    assert (fusion.mean_bytes, fusion.max_bytes) == (92, 120)
    assert fusion.unfused_allreduces == 2  # t6 and the lane's bucket
    text = format_summary(summarize(events))
    assert "2 fused buffers holding 5 tensors" in text and "2.5 tensors per buffer" in text


def test_a_tensor_seen_twice_starts_a_new_batch():
    events = [name(1, "a"), name(2, "b"),
              begin(1, "ALLREDUCE", 0), begin(2, "ALLREDUCE", 1),
              begin(1, "MEMCPY_IN_FUSION_BUFFER", 2), begin(2, "MEMCPY_IN_FUSION_BUFFER", 3),
              # an oddity: the same tensor starts MEMCPY_IN again (the writer ends the open activity first)
              end(1, 4), begin(1, "MEMCPY_IN_FUSION_BUFFER", 4),
              end(1, 5), end(1, 6, {"dtype": "float32", "shape": "[1]"}),
              end(2, 7), end(2, 8, {"dtype": "float32", "shape": "[1]"})]
    fusion = summarize(events).fusion
    assert (fusion.buffers, fusion.max_tensors, fusion.fused_tensors) == (2, 2, 3)


# ---- waits per rank ----------------------------------------------------------------------------------


def test_negotiation_laggard_is_the_last_rank_ready():
    events = [name(1, "g0"), *negotiation(1, {0: 0, 1: 40_000, 2: 1_000}), *operation(1, 40_100, 41_000),
              name(2, "g1"), *negotiation(2, {0: 50_000, 2: 110_000, 1: 51_000}), *operation(2, 110_100, 111_000),
              name(3, "g2"), *negotiation(3, {0: 120_000, 1: 120_300, 2: 120_600}),  # within 1 ms: a tie
              *operation(3, 120_700, 121_000),
              name(4, "g3"), *negotiation(4, {1: 130_000, 0: 150_000, 2: 135_000}), *operation(4, 150_100, 151_000)]
    summary = summarize(events)
    assert summary.negotiations == 4
    ranks = {r.rank: r for r in summary.ranks}
    assert [ranks[r].last_in_negotiations for r in range(3)] == [1, 1, 1]
    assert ranks[2].wait_caused_s == pytest.approx(0.060)
    assert ranks[1].wait_caused_s == pytest.approx(0.040)
    assert ranks[0].wait_caused_s == pytest.approx(0.020)
    assert all(r.negotiations == 4 for r in summary.ranks)
    assert summary.slowest_rank is not None and summary.slowest_rank.rank == 2
    assert ("slowest rank: 2 (last to be ready in 1 of 4 negotiations, made the others wait 0.06 s in all)"
            in format_summary(summary))


def test_overlapping_waits_count_once_in_the_wall_time():
    # two tensors negotiated together, both waiting 50 ms for rank 1
    events = [name(1, "a"), name(2, "b"),
              begin(1, "NEGOTIATE_ALLREDUCE", 0), instant(1, "0", 0),
              begin(2, "NEGOTIATE_ALLREDUCE", 5), instant(2, "0", 5),
              instant(1, "1", 50_000), instant(2, "1", 50_010), end(1, 50_020), end(2, 50_030),
              *operation(1, 50_100, 51_000), *operation(2, 51_100, 52_000)]
    (rank0, rank1) = summarize(events).ranks
    assert rank1.last_in_negotiations == 2 and rank0.last_in_negotiations == 0
    assert rank1.wait_caused_s == pytest.approx(0.050010)  # from 0 to 50_010 µs
    assert rank1.wait_caused_sum_s == pytest.approx(0.050 + 0.050005)
    assert rank1.mean_wait_s == pytest.approx(rank1.wait_caused_sum_s / 2)


def test_cycle_markers_make_ranks_seen_in_one_cycle_a_tie():
    events = [name(1, "a"), name(2, "b"),
              cycle(0), begin(1, "NEGOTIATE_ALLREDUCE", 10), instant(1, "0", 10),
              instant(1, "1", 2_500),  # the same cycle, however late the engine wrote it
              end(1, 2_600), *operation(1, 2_700, 3_000),
              cycle(10_000), begin(2, "NEGOTIATE_ALLREDUCE", 10_010), instant(2, "0", 10_010),
              cycle(30_000), instant(2, "1", 30_010), end(2, 30_050), *operation(2, 30_100, 31_000)]
    summary = summarize(events)
    ranks = {r.rank: r for r in summary.ranks}
    assert ranks[1].last_in_negotiations == 1 and ranks[0].last_in_negotiations == 0
    assert ranks[1].wait_caused_s == pytest.approx(0.020)  # cycle start to cycle start
    assert summary.cycle_marks_s == [0.0, 0.01, 0.03]


def test_lane_wait_laggard_is_the_rank_that_waited_least():
    events = [name(1, "bucket.0.w"),
              *operation(1, 0, 5_000), instant(1, "LANE_WAIT", 5_000, {"waits_ms": [30.0, 0.2, 25.0]}),
              *operation(1, 10_000, 15_000), instant(1, "LANE_WAIT", 15_000, {"waits_ms": [12.0, 0.0, 3.0]}),
              *operation(1, 20_000, 25_000), instant(1, "LANE_WAIT", 25_000, {"waits_ms": [0.1, 0.3, 0.2]}),
              name(2, "allreduce.x"), *negotiation(2, {1: 30_000, 0: 40_000}), *operation(2, 40_100, 41_000)]
    summary = summarize(events)
    assert summary.lane_steps == 3
    ranks = {r.rank: r for r in summary.ranks}
    assert (ranks[1].last_in_lane_steps, ranks[1].lane_steps) == (2, 3)
    assert ranks[1].wait_caused_sum_s == pytest.approx(0.0298 + 0.012)
    assert ranks[2].last_in_lane_steps == 0  # it waited 3 ms or more longer than rank 1
    assert (ranks[0].last_in_lane_steps, ranks[0].last_in_negotiations) == (0, 1)
    assert ranks[0].wait_caused_s == pytest.approx(0.010)
    assert summary.slowest_rank is not None and summary.slowest_rank.rank == 1
    line = next(line for line in format_summary(summary).splitlines() if line.startswith("slowest rank"))
    assert line == ("slowest rank: 1 (last to be ready in 0 of 1 negotiation and 2 of 3 lane steps, "
                    "made the others wait 0.04 s in all)")


def test_lane_ranks_within_a_millisecond_of_the_least_wait_are_all_last():
    events = [name(1, "bucket.0.w"), *operation(1, 0, 5_000),
              instant(1, "LANE_WAIT", 5_000, {"waits_ms": [12.0, 0.0, 0.5]})]
    ranks = summarize(events).ranks
    assert [r.last_in_lane_steps for r in ranks] == [0, 1, 1]
    assert [r.wait_caused_sum_s for r in ranks] == pytest.approx([0.0, 0.012, 0.0115])


def test_no_slowest_rank_without_waits():
    events = [name(1, "a"), *negotiation(1, {0: 0, 1: 100}), *operation(1, 200, 300)]
    summary = summarize(events)
    assert summary.slowest_rank is None
    assert "slowest rank: none" in format_summary(summary)
    assert "slowest rank: unknown" in format_summary(summarize([name(1, "a"), *operation(1, 0, 10)]))


# ---- steps ------------------------------------------------------------------------------------------


def test_steps_start_when_a_tensor_comes_again():
    events = [name(1, "w"), name(2, "b")]
    for step in range(4):
        t = step * 100_000
        events += [*negotiation(1, {0: t, 1: t + 5_000}), *operation(1, t + 6_000, t + 16_000),
                   *operation(2, t + 20_000, t + 30_000)]
    summary = summarize(events)
    assert "comes again" in summary.step_rule
    assert [step.ops for step in summary.steps] == [2, 2, 2, 2]
    assert [step.start_s for step in summary.steps] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    first = summary.steps[0]
    assert first.comm_s == pytest.approx(0.020) and first.negotiation_s == pytest.approx(0.00501)
    assert first.total_bytes == 80


def test_steps_fall_back_to_equal_windows_when_names_do_not_repeat():
    events = []
    for index in range(30):
        events += [name(index + 1, f"g{index}"), *operation(index + 1, index * 1_000, index * 1_000 + 500)]
    summary = summarize(events)
    assert "equal time windows" in summary.step_rule
    assert len(summary.steps) == 20 and sum(step.ops for step in summary.steps) == 30
    assert summary.steps[-1].end_s == pytest.approx(0.0295)


# ---- files and output ----------------------------------------------------------------------------------


def sample_events() -> list[dict]:
    return [name(1, "allreduce.a"), *negotiation(1, {0: 0, 1: 30_000}), *operation(1, 30_100, 40_000),
            name(2, "allreduce.b"), *negotiation(2, {1: 41_000, 0: 42_000}), *operation(2, 42_100, 45_000)]


def test_a_truncated_trace_is_read(tmp_path):
    events = sample_events()
    path = tmp_path / "cut.json"
    text = "[\n" + ",\n".join(json.dumps(event) for event in events)
    for body in (text, text + ",\n", text + ",\n" + json.dumps(events[0])[:25]):
        path.write_text(body)
        assert load_trace(path) == events
    path.write_text(text + ",\n" + '{"ph": "E", "args": {"dtype": "float32"}')  # nested object cut off
    assert load_trace(path) == events


def test_an_open_span_in_a_truncated_trace_is_counted_not_used(tmp_path):
    events = sample_events() + [begin(1, "ALLREDUCE", 50_000), begin(1, "GLOO_ALLREDUCE", 50_001)]
    summary = summarize(events)
    assert summary.ops == 2 and summary.open_spans == 2
    assert "2 spans never ended" in format_summary(summary)


@pytest.mark.parametrize("content, reason", [
    ("", "invalid JSON"),
    ("not a trace at all", "invalid JSON"),
    ('{"a": 1}', "expected a JSON array"),
    ("[1, 2]", "event 0 is a JSON int"),
    ('[{"ph": "B"', "invalid JSON"),
])
def test_an_invalid_trace_is_a_value_error_naming_the_file(tmp_path, content, reason):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=reason) as error:
        load_trace(path)
    assert str(path) in str(error.value)


def test_chrome_object_format_is_accepted(tmp_path):
    path = tmp_path / "object.json"
    path.write_text(json.dumps({"traceEvents": sample_events(), "displayTimeUnit": "ms"}))
    assert load_trace(path) == sample_events()


def test_summary_to_dict_is_json(tmp_path):
    data = json.loads(json.dumps(summary_to_dict(summarize(sample_events(), source="x.json"), top=1)))
    assert data["source"] == "x.json"
    assert [t["name"] for t in data["tensors"]] == ["allreduce.a"]
    assert data["slowest_rank"]["rank"] == 1 and data["slowest_rank"]["times_last"] == 1
    assert {"duration_s", "comm_fraction"} <= set(data["steps"][0])


def test_plot_writes_a_png_from_events(tmp_path):
    path = tmp_path / "plot.png"
    assert plot(sample_events(), path) == str(path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    empty = tmp_path / "empty.png"
    plot([], empty)
    assert empty.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_cli_text_json_and_errors(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    write_trace(trace, sample_events())
    assert main(["summarize", str(trace), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Timeline {trace}:") and "slowest rank: 1 " in out
    assert main(["summarize", str(trace), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slowest_rank"]["rank"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text("nope")
    assert main(["summarize", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchring timeline: error: ") and str(bad) in err and len(err.splitlines()) == 1
    assert main(["summarize", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "missing.json" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["summarize", str(trace), "--top", "0"])
    assert exit_info.value.code == 2
