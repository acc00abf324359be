"""The flight recorder in a real 2-rank job: rank 0's file shows a request it submitted and rank 1 did
not, with the missing rank, while the job waits. (The steps it records reach the launcher's straggler
watch in ``test_hang_detector``; the file's fields are checked in ``tests/unit/test_flight_recorder``.)"""

from __future__ import annotations

import time

from torchring.launch.sampling.flight_report import format_flight_record, read_flight_record

from .jobs import python_script, start_job


def test_a_request_only_rank_0_submitted_shows_as_waiting_for_rank_1(tmp_path):
    process, _ = start_job("run", "-np", "2", *python_script("flight_recorder_job.py"), str(tmp_path),
                           env={"FLIGHT_MODE": "pending"})
    try:
        deadline = time.monotonic() + 30
        content = None
        while time.monotonic() < deadline and process.poll() is None:
            content = read_flight_record(tmp_path / "ops.0")
            if content and content["pending"] and content["pending"][0]["missing_ranks"]:
                break
            time.sleep(0.05)
        assert content and content["pending"], content
        (pending,) = content["pending"]
        assert (pending["op"], pending["name"], pending["missing_ranks"]) == ("allreduce", "x", [1])
        (line,) = format_flight_record(content, time.time())
        assert line.startswith("waiting for other ranks: allreduce 'x' since ")
        assert line.endswith(" s; not yet submitted by rank 1")
        rank_1 = read_flight_record(tmp_path / "ops.1")
        assert rank_1 is None or rank_1["pending"] == []
    finally:
        (tmp_path / "release").touch()
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "[0]<stdout>:x [2.0, 2.0]" in stdout and "[1]<stdout>:x [2.0, 2.0]" in stdout
    final = read_flight_record(tmp_path / "ops.0")
    assert final["pending"] == [] and [(e["name"], e["ended_at"] is not None) for e in final["recent"]] == [("x", True)]
