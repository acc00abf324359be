"""The flight recorder in real 2-rank jobs: each rank's file names its gradient reductions and step times
(enough for the straggler watch to name the slow rank), and shows a request rank 0 submitted and rank 1
did not, with the missing rank, while the job waits."""

from __future__ import annotations

import time

from torchring.launch.ops_report import format_ops, read_ops_file
from torchring.launch.stragglers import StragglerWatch

from .jobs import python_script, run_job, start_job


def test_ranks_record_their_gradient_reductions_and_steps_and_the_slow_rank_is_named(tmp_path):
    result = run_job("run", "-np", "2", *python_script("flight_recorder_job.py"), str(tmp_path),
                     env={"FLIGHT_MODE": "steps", "SLOW_S": "0.02"}, timeout=60)
    assert result.returncode == 0, result.stderr
    files = {rank: read_ops_file(tmp_path / f"ops.{rank}") for rank in (0, 1)}
    for rank, content in files.items():
        assert content is not None and content["rank"] == rank and content["size"] == 2
        assert content["pending"] == []
        names = [entry["name"] for entry in content["recent"]]
        assert len(names) == 8 and all(name.startswith("gradient bucket 0 (") for name in names), names
        assert all(entry["ended_at"] >= entry["started_at"] for entry in content["recent"])
        steps = content["steps"]
        assert steps["first"] == 0 and len(steps["wait"]) == len(steps["interval"]) == 30
        assert steps["interval"][0] is None and all(i > 0 for i in steps["interval"][1:])
    assert "last collectives: allreduce 'gradient bucket 0 (4 tensors)' (done" in format_ops(files[0], time.time())[0]
    logged: list[str] = []
    watch = StragglerWatch(logged.append)
    watch.update({rank: content["steps"] for rank, content in files.items()})
    assert len(logged) == 1 and logged[0].startswith("rank 1 is a straggler"), (logged, watch.gauges())
    assert watch.gauges()[1][1] >= 0.8


def test_a_request_only_rank_0_submitted_shows_as_waiting_for_rank_1(tmp_path):
    process, _ = start_job("run", "-np", "2", *python_script("flight_recorder_job.py"), str(tmp_path),
                           env={"FLIGHT_MODE": "pending"})
    try:
        deadline = time.monotonic() + 30
        content = None
        while time.monotonic() < deadline and process.poll() is None:
            content = read_ops_file(tmp_path / "ops.0")
            if content and content["pending"] and content["pending"][0]["missing_ranks"]:
                break
            time.sleep(0.05)
        assert content and content["pending"], content
        (pending,) = content["pending"]
        assert (pending["op"], pending["name"], pending["missing_ranks"]) == ("allreduce", "x", [1])
        (line,) = format_ops(content, time.time())
        assert line.startswith("waiting for other ranks: allreduce 'x' since ")
        assert line.endswith(" s; not yet submitted by rank 1")
        rank_1 = read_ops_file(tmp_path / "ops.1")
        assert rank_1 is None or rank_1["pending"] == []
    finally:
        (tmp_path / "release").touch()
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "[0]<stdout>:x [2.0, 2.0]" in stdout and "[1]<stdout>:x [2.0, 2.0]" in stdout
    final = read_ops_file(tmp_path / "ops.0")
    assert final["pending"] == [] and [(e["name"], e["ended_at"] is not None) for e in final["recent"]] == [("x", True)]
