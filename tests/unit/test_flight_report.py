"""The hang report's lines from a rank's flight-recorder file, and reading such files safely: they are
written by another process, so bad content must give fewer lines, never an error."""

from __future__ import annotations

import json

import pytest

from torchring.launch.sampling.flight_report import MAX_FLIGHT_RECORD_BYTES, format_flight_record, read_flight_record

NOW = 1_000_000.0


def ops(**fields) -> dict:
    return {"version": 1, "pid": 12, "rank": 0, "size": 4, "written_at": NOW - 1, "recent": [], "pending": [],
            "steps": None, **fields}


def test_last_collectives_and_what_the_rank_waits_for():
    content = ops(
        recent=[{"op": "allreduce", "name": "old", "started_at": NOW - 90, "ended_at": NOW - 89},
                {"op": "allreduce", "name": "grad.fc1.weight", "started_at": NOW - 1, "ended_at": NOW - 0.3},
                {"op": "broadcast", "name": "weights", "started_at": NOW - 0.2, "ended_at": NOW - 0.1},
                {"op": "allreduce", "name": "loss", "started_at": NOW - 35, "ended_at": None}],
        pending=[{"op": "allreduce", "name": "loss", "since": NOW - 35.2, "missing_ranks": [1, 3]},
                 {"op": "allreduce", "name": "gradient bucket 0 (4 tensors)", "since": NOW - 2, "missing_ranks": None}])
    assert format_flight_record(content, NOW) == [
        "last collectives: allreduce 'grad.fc1.weight' (done 0.3 s ago), broadcast 'weights' (done 0.1 s ago), "
        "allreduce 'loss' (started 35 s ago, not done)",
        "waiting for other ranks: allreduce 'loss' since 35 s; not yet submitted by ranks 1,3",
        "waiting for other ranks: allreduce 'gradient bucket 0 (4 tensors)' since 2.0 s",
    ]


def test_nothing_recorded_gives_no_lines():
    assert format_flight_record(ops(), NOW) == []


def test_many_pending_requests_are_summed_up():
    pending = [{"op": "allreduce", "name": f"t{i}", "since": NOW - 5, "missing_ranks": [2]} for i in range(10)]
    lines = format_flight_record(ops(pending=pending), NOW)
    assert len(lines) == 4 and lines[-1] == "and 7 more pending"


@pytest.mark.parametrize("content", [
    None, [], "text", 5,
    ops(recent="x", pending={"a": 1}),
    ops(recent=[None, 3, {"op": 1, "name": "a", "started_at": NOW}, {"op": "allreduce", "started_at": NOW},
                {"op": "allreduce", "name": "a", "started_at": "yesterday"},
                {"op": "allreduce", "name": "a", "started_at": True, "ended_at": float("nan")}],
        pending=[{"op": "allreduce", "name": "b"}, {"op": "allreduce", "name": "b", "since": [1]}, "c"]),
])
def test_malformed_content_gives_fewer_lines_and_never_raises(content):
    assert format_flight_record(content, NOW) == []


def test_names_are_cut_and_cleaned_and_missing_ranks_validated():
    content = ops(recent=[{"op": "allreduce\n", "name": "n" * 500 + "\x1b[2J", "started_at": NOW - 1,
                           "ended_at": NOW + 5}],
                  pending=[{"op": "allreduce", "name": "x", "since": NOW - 1, "missing_ranks": [1, "2", True, 3]},
                           {"op": "allreduce", "name": "y", "since": NOW - 1, "missing_ranks": list(range(100))}])
    recent, first, second = format_flight_record(content, NOW)
    assert recent == f"last collectives: allreduce? '{'n' * 79}…' (done 0.0 s ago)"  # a clock ahead counts as 0
    assert first.endswith("; not yet submitted by ranks 1,3")
    assert second.endswith("; not yet submitted by ranks " + ",".join(map(str, range(16))) + " (and 84 more)")
    assert all(line.isprintable() and len(line) < 400 for line in (recent, first, second))


def test_read_flight_record_accepts_only_the_recorders_json(tmp_path):
    path = tmp_path / "ops.0"
    path.write_text(json.dumps(ops()))
    assert read_flight_record(path) == ops()
    assert read_flight_record(tmp_path / "missing") is None
    for bad in (b"{not json", b"\xff\xfe", b"[1, 2]", json.dumps({**ops(), "version": 2}).encode(),
                b"[" * 100_000 + b"]" * 100_000, b'{"version": 1, "pid": ' + b"9" * 10_000 + b"}"):
        path.write_bytes(bad)
        assert read_flight_record(path) is None, bad[:40]


def test_read_flight_record_refuses_an_oversized_file(tmp_path):
    path = tmp_path / "ops.0"
    padding = "x" * MAX_FLIGHT_RECORD_BYTES
    path.write_text(json.dumps(ops(recent=[{"op": "allreduce", "name": padding, "started_at": NOW}])))
    assert read_flight_record(path) is None
    path.write_text(json.dumps(ops(recent=[{"op": "allreduce", "name": "a" * 1000, "started_at": NOW}])))
    assert read_flight_record(path)["recent"][0]["name"] == "a" * 1000


def test_progress_is_new_collectives_submissions_or_steps_not_a_rewrite_or_new_missing_ranks():
    from torchring.launch.sampling.flight_report import progress_mark

    base = {"version": 1, "written_at": 10.0, "recent": [{"op": "allreduce", "name": "a", "started_at": 1.0,
                                                          "ended_at": 2.0}],
            "pending": [{"op": "allreduce", "name": "b", "since": 3.0, "missing_ranks": None}],
            "steps": {"first": 0, "wait": [0.1], "interval": [None]}}
    rewritten = {**base, "written_at": 11.0,
                 "pending": [{"op": "allreduce", "name": "b", "since": 3.0, "missing_ranks": [1]}]}
    assert progress_mark(base) == progress_mark(rewritten)
    stepped = {**base, "steps": {"first": 0, "wait": [0.1, 0.2], "interval": [None, 1.0]}}
    assert progress_mark(stepped) != progress_mark(base)
    assert progress_mark({**base, "steps": {"wait": 3}}) is not None and progress_mark(None) is None
