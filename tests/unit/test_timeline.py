"""The timeline writer: Horovod's Chrome trace-event file, valid JSON after every write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from torchring.runtime.observe import timeline as timeline_module
from torchring.runtime.observe.timeline import NullTimeline, TimelineWriter


def load(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as file:
        events = json.load(file)
    assert isinstance(events, list)
    return events


def tensor_events(events: list[dict], name: str) -> list[dict]:
    """The non-metadata events of the tensor called ``name``."""
    (pid,) = [e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == name]
    return [e for e in events if e["pid"] == pid and e["ph"] != "M"]


def check_nesting(events: list[dict]) -> None:
    """B/E balanced per pid, never an E without a B, timestamps non-decreasing per pid."""
    depth: dict[int, int] = {}
    last_ts: dict[int, int] = {}
    for event in events:
        assert "pid" in event and "tid" in event
        if event["ph"] == "M":
            continue
        pid = event["pid"]
        assert isinstance(event["ts"], int)
        assert event["ts"] >= last_ts.get(pid, 0)
        last_ts[pid] = event["ts"]
        if event["ph"] == "B":
            depth[pid] = depth.get(pid, 0) + 1
        elif event["ph"] == "E":
            depth[pid] = depth.get(pid, 0) - 1
            assert depth[pid] >= 0
    assert all(d == 0 for d in depth.values())


def full_operation(writer: TimelineWriter, name: str, after_each=lambda: None) -> None:
    steps = [
        lambda: writer.negotiate_start(name, "allreduce"),
        lambda: writer.negotiate_rank_ready(name, 0),
        lambda: writer.negotiate_rank_ready(name, 1),
        lambda: writer.negotiate_end(name),
        lambda: writer.op_start(name, "allreduce"),
        lambda: writer.activity_start(name, "QUEUE"),
        lambda: writer.activity_end(name),
        lambda: writer.activity_start(name, "MEMCPY_IN_FUSION_BUFFER"),
        lambda: writer.activity_end(name),
        lambda: writer.activity_start(name, "GLOO_ALLREDUCE"),
        lambda: writer.activity_end(name),
        lambda: writer.op_end(name, "float32", (2, 3)),
    ]
    for step in steps:
        step()
        after_each()


def test_valid_json_after_construction_each_call_and_close(tmp_path):
    path = tmp_path / "timeline.json"
    writer = TimelineWriter(path)
    assert load(path) == []
    sizes = []

    def check():
        load(path)
        sizes.append(path.stat().st_size)

    full_operation(writer, "grad.weight", check)
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)  # every call reached the file
    writer.flush()
    load(path)
    writer.close()
    writer.close()  # idempotent
    events = load(path)
    check_nesting(events)
    writer.op_start("late", "allreduce")  # a no-op after close
    assert load(path) == events


def test_process_name_metadata_per_tensor(tmp_path):
    path = tmp_path / "timeline.json"
    with TimelineWriter(path) as writer:
        for name in ("a", "b", "a", "c"):
            writer.op_start(name, "allgather")
            writer.op_end(name, "int64", (4,))
    events = load(path)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(names.values()) == ["a", "b", "c"]
    assert len(set(names)) == 3 and 0 not in names
    sort_index = {e["pid"] for e in events if e.get("name") == "process_sort_index"}
    assert sort_index == set(names)
    # Metadata precedes the tensor's first event.
    first = {pid: next(i for i, e in enumerate(events) if e["pid"] == pid and e["ph"] != "M") for pid in names}
    for i, event in enumerate(events):
        if event["ph"] == "M":
            assert i < first[event["pid"]]


def test_negotiation_span_with_rank_instants(tmp_path):
    path = tmp_path / "timeline.json"
    with TimelineWriter(path) as writer:
        full_operation(writer, "grad")
    events = tensor_events(load(path), "grad")
    phases = [(e["ph"], e.get("name")) for e in events[:5]]
    assert phases == [("B", "NEGOTIATE_ALLREDUCE"), ("i", "0"), ("i", "1"), ("E", None), ("B", "ALLREDUCE")]
    assert all(e["s"] == "p" for e in events if e["ph"] == "i")


def test_operation_span_with_nested_activities(tmp_path):
    path = tmp_path / "timeline.json"
    with TimelineWriter(path) as writer:
        full_operation(writer, "grad")
    all_events = load(path)
    check_nesting(all_events)
    events = tensor_events(all_events, "grad")[4:]
    assert [(e["ph"], e.get("name")) for e in events] == [
        ("B", "ALLREDUCE"),
        ("B", "QUEUE"), ("E", None),
        ("B", "MEMCPY_IN_FUSION_BUFFER"), ("E", None),
        ("B", "GLOO_ALLREDUCE"), ("E", None),
        ("E", None),
    ]
    assert events[-1]["args"] == {"dtype": "float32", "shape": "[2, 3]"}
    assert all("args" not in e for e in events[:-1])


def test_op_end_formats_torch_dtype_and_size_and_closes_open_activity(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "timeline.json"
    with TimelineWriter(path) as writer:
        writer.op_start("t", "broadcast")
        writer.activity_start("t", "NCCL_BROADCAST")
        writer.op_end("t", torch.float16, torch.Size([]))
        writer.op_start("u", "alltoall")
        writer.activity_start("u", "QUEUE")
        writer.activity_start("u", "NCCL_ALLTOALL")  # ends QUEUE first
        writer.op_end("u", torch.int32, torch.Size([5, 1, 2]))
    events = load(path)
    check_nesting(events)
    t = tensor_events(events, "t")
    assert [e["ph"] for e in t] == ["B", "B", "E", "E"]
    assert t[-1]["args"] == {"dtype": "float16", "shape": "[]"}
    u = tensor_events(events, "u")
    assert [(e["ph"], e.get("name")) for e in u] == [
        ("B", "ALLTOALL"), ("B", "QUEUE"), ("E", None), ("B", "NCCL_ALLTOALL"), ("E", None), ("E", None)]
    assert u[-1]["args"] == {"dtype": "int32", "shape": "[5, 1, 2]"}


def test_out_of_order_calls_keep_spans_balanced(tmp_path):
    path = tmp_path / "timeline.json"
    with TimelineWriter(path) as writer:
        writer.negotiate_rank_ready("x", 0)  # nothing to attach to: ignored
        writer.negotiate_end("x")
        writer.activity_start("x", "QUEUE")
        writer.activity_end("x")
        writer.op_end("x", "float32", (1,))
        writer.negotiate_start("x", "reducescatter")
        writer.op_start("x", "reducescatter")  # closes the negotiation
        writer.activity_start("x", "QUEUE")
        writer.negotiate_start("x", "barrier")  # closes the activity and the operation
        writer.negotiate_end("x")
    events = load(path)
    check_nesting(events)
    assert [(e["ph"], e.get("name")) for e in tensor_events(events, "x")] == [
        ("B", "NEGOTIATE_REDUCESCATTER"), ("E", None),
        ("B", "REDUCESCATTER"), ("B", "QUEUE"), ("E", None), ("E", None),
        ("B", "NEGOTIATE_BARRIER"), ("E", None),
    ]


def test_cycle_marks_only_when_enabled(tmp_path):
    off_path, on_path = tmp_path / "off.json", tmp_path / "on.json"
    with TimelineWriter(off_path) as off, TimelineWriter(on_path, mark_cycles=True) as on:
        for writer in (off, on):
            writer.mark_cycle()
            writer.op_start("t", "join")
            writer.mark_cycle()
            writer.op_end("t", "uint8", ())
    assert not [e for e in load(off_path) if e.get("name") == "CYCLE_START"]
    events = load(on_path)
    marks = [e for e in events if e.get("name") == "CYCLE_START"]
    assert len(marks) == 2
    assert all(m["ph"] == "i" and m["s"] == "g" and m["pid"] == 0 and "tid" in m for m in marks)
    assert marks[0]["ts"] <= marks[1]["ts"]
    check_nesting(events)


def test_batch_writes_once_on_exit(tmp_path):
    path = tmp_path / "timeline.json"
    with TimelineWriter(path) as writer:
        with writer.batch():
            writer.op_start("t", "allreduce")
            with writer.batch():
                writer.activity_start("t", "QUEUE")
            assert load(path) == []  # nothing written until the outermost batch ends
        assert [e["ph"] for e in tensor_events(load(path), "t")] == ["B", "B"]
        with writer.batch():
            writer.activity_end("t")
            writer.flush()  # an explicit flush writes inside a batch too
            assert [e["ph"] for e in tensor_events(load(path), "t")] == ["B", "B", "E"]


def test_long_batch_is_written_in_valid_chunks(tmp_path):
    path = tmp_path / "timeline.json"
    with TimelineWriter(path) as writer, writer.batch():
        for i in range(2000):
            writer.op_start(f"tensor.{i}", "allreduce")
        assert len(load(path)) > 0  # passed the size threshold: partly written, still valid
    assert len(load(path)) == 2000 * 3


def test_names_needing_escapes(tmp_path):
    path = tmp_path / "timeline.json"
    name = 'we"ird\\name\n\u00e9'
    with TimelineWriter(path) as writer:
        writer.op_start(name, "allreduce")
        writer.op_end(name, "float32", (1,))
    assert len(tensor_events(load(path), name)) == 2


def test_concurrent_threads_keep_the_file_valid(tmp_path):
    path = tmp_path / "timeline.json"
    writer = TimelineWriter(path, mark_cycles=True)
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(thread: int) -> None:
        try:
            for i in range(150):
                full_operation(writer, f"t{thread}.{i % 7}")
                writer.mark_cycle()
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    def read_while_writing() -> None:
        # Reads between writes: a plain read racing a write may combine the file before and after it.
        while not stop.is_set():
            try:
                with writer._lock:
                    load(path)
            except BaseException as error:  # noqa: BLE001
                errors.append(error)
                return
            time.sleep(0.005)  # let the writers in: a read holds their lock for the whole file

    reader = threading.Thread(target=read_while_writing, daemon=True)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    reader.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    reader.join()
    writer.close()
    assert not errors
    events = load(path)
    check_nesting(events)
    assert sum(1 for e in events if e.get("name") == "process_name") == 4 * 7 + 1
    assert sum(1 for e in events if e["ph"] == "E" and "args" in e) == 4 * 150


_KILLED_CHILD = textwrap.dedent(
    """
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("timeline", sys.argv[1])
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    writer = timeline.TimelineWriter(sys.argv[2], mark_cycles=True)
    i = 0
    while True:
        name = "grad.%d" % (i % 50)
        writer.mark_cycle()
        writer.negotiate_start(name, "allreduce")
        writer.negotiate_rank_ready(name, 0)
        writer.negotiate_end(name)
        with writer.batch():
            writer.op_start(name, "allreduce")
            writer.activity_start(name, "NCCL_ALLREDUCE")
        writer.op_end(name, "float32", (i, 3))
        i += 1
        if i == 200:
            print("ready", flush=True)
    """
)


def test_killed_writer_leaves_a_readable_trace(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_KILLED_CHILD)
    for attempt, delay in enumerate((0.0, 0.05, 0.2)):
        path = tmp_path / f"killed{attempt}.json"
        child = subprocess.Popen(
            [sys.executable, str(script), timeline_module.__file__, str(path)],
            stdout=subprocess.PIPE,
        )
        try:
            assert child.stdout.readline() == b"ready\n"
            time.sleep(delay)
            os.kill(child.pid, signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
        events = load(path)
        assert sum(1 for e in events if "args" in e and "dtype" in e["args"]) >= 200


def test_unwritable_path_raises_naming_the_path(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    for path in (tmp_path / "missing" / "timeline.json", not_a_directory / "timeline.json", tmp_path):
        with pytest.raises(OSError) as info:
            TimelineWriter(path)
        assert str(path) in str(info.value)
        assert info.value.filename == str(path)
        assert "timeline" in str(info.value)


def test_null_timeline_has_the_same_methods():
    null = NullTimeline()
    public = {name for name in dir(TimelineWriter) if not name.startswith("_")} - {"path", "mark_cycles"}
    assert public <= set(dir(null))
    assert not null.enabled and TimelineWriter.enabled
    null.negotiate_start("t", "allreduce")
    null.negotiate_rank_ready("t", 0)
    null.negotiate_end("t")
    null.op_start("t", "allreduce")
    with null.batch():
        null.activity_start("t", "QUEUE")
        null.activity_end("t")
    null.op_end("t", "float32", (1,))
    null.mark_cycle()
    null.flush()
    null.close()
