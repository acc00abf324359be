"""The rank's flight recorder: what it records, the file it writes (format version 1), when it writes,
and that ``init()`` starts it only when ``TORCHRING_FLIGHT_RECORD`` is set."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch

import torchring as hvd
from torchring.contract import FLIGHT_RECORD_FILE
from torchring.launch.sampling.flight_report import format_flight_record, read_flight_record
from torchring.runtime.coordination.negotiation import Negotiator
from torchring.runtime.coordination.stall_inspector import StallInspector
from torchring.runtime.observe import flight_recorder
from torchring.runtime.observe.flight_recorder import NULL_RECORDER, FlightRecorder, open_recorder
from torchring.runtime.requests import OpType, Request, RequestMeta


def request(name: str, op: OpType = OpType.ALLREDUCE) -> Request:
    return Request(RequestMeta(name, op))


def wait_for_file(path: Path, condition, timeout: float = 10.0) -> dict:
    """The file's content once ``condition(content)`` holds (polled until ``timeout``)."""
    deadline = time.monotonic() + timeout
    content = None
    while time.monotonic() < deadline:
        content = read_flight_record(path)
        if content is not None and condition(content):
            return content
        time.sleep(0.02)
    raise AssertionError(f"{path} never satisfied the condition; last content: {content}")


@pytest.fixture
def recorder(tmp_path):
    made = FlightRecorder(str(tmp_path / "ops.0"), rank=0, size=2, interval_s=0.05)
    yield made
    made.close()


def test_the_file_holds_the_last_collectives_pending_requests_and_steps(recorder, tmp_path):
    for index in range(10):
        recorder.ended(recorder.started("allreduce", f"allreduce.t{index}"))
    running = recorder.started("broadcast", "broadcast.weights")
    recorder.submitted([request("allreduce.loss"), request("allreduce.done")])
    recorder.finished((0, "allreduce.done"))
    bucket = recorder.started("allreduce", "gradient bucket 0 (3 tensors)", pending=True)
    for index in range(3):
        recorder.step(recorder, index, wait_s=0.5, interval_s=None if index == 0 else 1.5)
    recorder.close()
    content = json.loads((tmp_path / "ops.0").read_text())
    assert set(content) == {"version", "pid", "rank", "size", "written_at", "recent", "pending", "steps"}
    assert (content["version"], content["pid"], content["rank"], content["size"]) == (1, os.getpid(), 0, 2)
    recent = content["recent"]
    assert [entry["name"] for entry in recent] == ["t4", "t5", "t6", "t7", "t8", "t9", "weights",
                                                   "gradient bucket 0 (3 tensors)"]
    assert recent[-2] == {"op": "broadcast", "name": "weights", "started_at": running.started_at, "ended_at": None}
    assert all(entry["ended_at"] >= entry["started_at"] for entry in recent[:6])
    assert [(p["op"], p["name"], p["missing_ranks"]) for p in content["pending"]] == [
        ("allreduce", "loss", None), ("allreduce", "gradient bucket 0 (3 tensors)", None)]
    assert content["pending"][1]["since"] == bucket.started_at
    assert content["steps"] == {"first": 0, "wait": [0.5, 0.5, 0.5], "interval": [None, 1.5, 1.5]}


def test_ended_and_forgotten_lane_buckets_are_no_longer_pending(recorder):
    done = recorder.started("allreduce", "gradient bucket 0 (1 tensors)", pending=True)
    dropped = recorder.started("allreduce", "gradient bucket 1 (1 tensors)", pending=True)
    recorder.ended(done)
    recorder.forget(dropped)
    content = recorder.snapshot()
    assert content["pending"] == []
    assert [entry["ended_at"] is None for entry in content["recent"]] == [False, True]


def test_pending_is_capped_at_the_oldest_sixteen(recorder):
    recorder.submitted([request(f"allreduce.r{index}") for index in range(40)])
    pending = recorder.snapshot()["pending"]
    assert [entry["name"] for entry in pending] == [f"r{index}" for index in range(16)]


def test_steps_keep_the_last_hundred_of_the_first_optimizer_only(recorder):
    other = object()
    for index in range(130):
        recorder.step(recorder, index, wait_s=index / 1000, interval_s=0.1)
        recorder.step(other, index, wait_s=9.0, interval_s=9.0)
    steps = recorder.snapshot()["steps"]
    assert steps["first"] == 30 and len(steps["wait"]) == len(steps["interval"]) == 100
    assert steps["wait"][0] == 0.03 and 9.0 not in steps["wait"]


def test_missing_ranks_come_from_the_negotiation_table(recorder, tmp_path):
    """Rank 0 submitted 'x' and 'y'; rank 1 only 'y'; the engine thread answers the writer's question."""
    negotiator = Negotiator(3, {0: (0, 1, 2)}.get)
    negotiator.record(0, [RequestMeta("allreduce.x", OpType.ALLREDUCE), RequestMeta("allreduce.y", OpType.ALLREDUCE)])
    negotiator.record(1, [RequestMeta("allreduce.y", OpType.ALLREDUCE)])
    inspector = StallInspector(negotiator, enabled=False, warning_s=60.0, shutdown_s=0.0)
    assert inspector.missing_ranks([(0, "allreduce.x"), (0, "allreduce.y"), (0, "gone")]) == {
        (0, "allreduce.x"): [1, 2], (0, "allreduce.y"): [2]}
    recorder.submitted([request("allreduce.x"), request("allreduce.y")])
    stop = threading.Event()

    def engine_cycles() -> None:  # what Engine._inspect_stalls does every cycle
        while not stop.wait(0.001):
            if recorder.wants_missing:
                recorder.set_missing(inspector.missing_ranks(recorder.pending_keys()))

    engine = threading.Thread(target=engine_cycles, daemon=True)
    engine.start()
    try:
        content = wait_for_file(tmp_path / "ops.0", lambda c: any(p["missing_ranks"] for p in c["pending"]))
    finally:
        stop.set()
        engine.join()
    assert [(p["name"], p["missing_ranks"]) for p in content["pending"]] == [("x", [1, 2]), ("y", [2])]
    assert format_flight_record(content, time.time())[0].startswith("waiting for other ranks: allreduce 'x' since ")
    assert format_flight_record(content, time.time())[0].endswith("; not yet submitted by ranks 1,2")


def test_the_writer_writes_changes_and_nothing_when_nothing_changed(recorder, tmp_path):
    path = tmp_path / "ops.0"
    recorder.ended(recorder.started("allreduce", "allreduce.first"))
    first = wait_for_file(path, lambda c: [e["name"] for e in c["recent"]] == ["first"])
    recorder.close()  # the last write happens only when something changed since the previous one
    assert read_flight_record(path)["written_at"] == first["written_at"]
    assert not (tmp_path / "ops.0.partial").exists()


def test_a_write_into_a_vanished_directory_fails_quietly(tmp_path):
    directory = tmp_path / "job"
    directory.mkdir()
    made = FlightRecorder(str(directory / "ops.0"), rank=0, size=1, interval_s=0.02)
    directory.rmdir()
    made.ended(made.started("allreduce", "allreduce.a"))
    made.close()  # the final write fails quietly
    assert not directory.exists()


def test_without_the_variable_nothing_records(monkeypatch):
    monkeypatch.delenv(FLIGHT_RECORD_FILE, raising=False)
    monkeypatch.setattr(flight_recorder, "_claimed_path", None)
    assert open_recorder(None, 0, 1) is NULL_RECORDER
    assert NULL_RECORDER.started("allreduce", "x") is None and NULL_RECORDER.pending_keys() == []
    assert not NULL_RECORDER.wants_missing


def test_init_records_to_the_file_and_takes_the_variable_out_of_the_environment(monkeypatch, tmp_path):
    monkeypatch.setattr(flight_recorder, "_claimed_path", None)
    path = tmp_path / "ops.0"
    monkeypatch.setenv(FLIGHT_RECORD_FILE, str(path))
    threads_before = {t.name for t in threading.enumerate()}
    hvd.init()
    try:
        assert FLIGHT_RECORD_FILE not in os.environ
        assert "torchring-flight-recorder-0" in {t.name for t in threading.enumerate()} - threads_before
        hvd.allreduce(torch.ones(2), name="loss")
    finally:
        hvd.shutdown()
    content = read_flight_record(path)
    assert [(e["op"], e["name"]) for e in content["recent"]] == [("allreduce", "loss")]
    assert content["pending"] == [] and content["size"] == 1
    hvd.init()  # a re-initialisation (an elastic reset) keeps writing to the same file
    try:
        hvd.broadcast(torch.ones(2), root_rank=0, name="again")
        handles = [hvd.allreduce_async(torch.ones(3), name=f"fused{i}") for i in range(3)]  # one fused buffer
        for handle in handles:
            hvd.synchronize(handle)
        hvd.barrier()
    finally:
        hvd.shutdown()
    recent = read_flight_record(path)["recent"]
    assert [(e["op"], e["name"]) for e in (recent[0], recent[-1])] == [("broadcast", "again"), ("barrier", "barrier")]
    # a fused buffer is one collective on the wire: one record, named after its first tensor
    reductions = [e["name"] for e in recent[1:-1]]
    assert {e["op"] for e in recent[1:-1]} == {"allreduce"} and reductions[0].startswith("fused0")
    counted = [1 + int(m.group(1)) if (m := re.search(r" \(\+(\d+) fused\)$", name)) else 1 for name in reductions]
    assert sum(counted) == 3, reductions
    assert all(e["ended_at"] is not None for e in recent)
    assert "torchring-flight-recorder-0" not in {t.name for t in threading.enumerate()}
