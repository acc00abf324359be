"""The Chrome-trace timeline written by rank 0, from the launcher flag or HOROVOD_TIMELINE."""

import json

from .jobs import python_script, run_job


def test_timeline_of_a_short_training_run(tmp_path):
    path = tmp_path / "timeline.json"
    result = run_job("run", "-np", "2", "--timeline-filename", str(path), "--timeline-mark-cycles",
                     *python_script("timeline_training.py"))
    assert result.returncode == 0, result.stderr
    events = json.loads(path.read_text())
    tensors = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    # the optimizer's gradients travel as one bucket; broadcast_parameters sends each parameter
    assert {"allreduce.bucket.0.2.bias", "broadcast.0.weight", "broadcast.0.bias", "broadcast.2.weight",
            "broadcast.2.bias"} <= tensors
    names = {e.get("name") for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE", "NEGOTIATE_BROADCAST", "BROADCAST",
            "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER", "CYCLE_START", "0", "1"} <= names
    pids = {e["args"]["name"]: e["pid"] for e in events if e.get("name") == "process_name"}
    fused_pid = pids["allreduce.fused.pair_1of2"]
    assert "MEMCPY_IN_FUSION_BUFFER" in {e.get("name") for e in events if e["pid"] == fused_pid}
    closing = [e for e in events if e["ph"] == "E" and "args" in e]
    assert any(e["args"] == {"dtype": "float32", "shape": "[4, 8]"} for e in closing)
    assert not (tmp_path / "timeline.json.1").exists()


def test_timeline_stays_valid_json_when_rank_0_is_killed(tmp_path):
    path = tmp_path / "timeline.json"
    result = run_job("run", "-np", "2", *python_script("timeline_training.py"),
                     env={"HOROVOD_TIMELINE": str(path), "KILL_RANK0_AFTER": "3"})
    assert result.returncode != 0
    events = json.loads(path.read_text())
    assert any(e.get("name") == "ALLREDUCE" for e in events)


def test_stall_shutdown_time_fails_every_rank(tmp_path):
    result = run_job("run", "-np", "2", "--stall-check-warning-time-seconds", "1",
                     "--stall-check-shutdown-time-seconds", "2", *python_script("stall_forever.py"))
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        (line,) = result.lines("stdout", rank)
        assert line.startswith("stall error: torchring stopped: operations waited more than 2s")
    assert "only.rank1" in result.stderr and "waiting for ranks [0]" in result.stderr
