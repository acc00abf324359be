"""``torchring run`` on this host: variables, output, failures, signals, and no process left behind."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from torchring import cli

from .jobs import JobResult, processes_with_marker, python_script, run_job, start_job, wait_until_gone


def test_every_rank_gets_torchring_horovod_and_torchrun_variables():
    result = run_job("run", "-np", "3", *python_script("print_env.py"))
    assert result.returncode == 0, result.stderr
    ports = set()
    for rank in range(3):
        values = dict(line.split("=", 1) for line in result.lines("stdout", rank) if "=" in line)
        assert values["RANK"] == values["HOROVOD_RANK"] == values["TORCHRING_RANK"] == str(rank)
        assert values["WORLD_SIZE"] == values["HOROVOD_SIZE"] == "3"
        assert values["LOCAL_RANK"] == values["HOROVOD_LOCAL_RANK"] == str(rank)
        assert values["LOCAL_WORLD_SIZE"] == values["HOROVOD_LOCAL_SIZE"] == "3"
        assert values["HOROVOD_CROSS_RANK"] == "0" and values["HOROVOD_CROSS_SIZE"] == "1"
        assert values["MASTER_ADDR"] == "127.0.0.1"
        assert int(values["OMP_NUM_THREADS"]) >= 1
        ports.add(values["MASTER_PORT"])
        assert "partial line without newline" in result.lines("stdout", rank)
    assert len(ports) == 1


def test_output_lines_are_prefixed_with_rank_and_stream():
    result = run_job("run", "-np", "2", "python", "-c",
                     "import sys, os; print('out', os.environ['RANK']); print('err', file=sys.stderr)")
    assert result.returncode == 0
    assert sorted(line for line in result.stdout.splitlines() if "<stdout>" in line) == [
        "[0]<stdout>:out 0", "[1]<stdout>:out 1"]
    assert sorted(result.stderr.splitlines()) == ["[0]<stderr>:err", "[1]<stderr>:err"]


def test_ranks_filter_shows_only_chosen_ranks():
    result = run_job("run", "-np", "3", "--ranks", "1", "python", "-c", "import os; print('hi', os.environ['RANK'])")
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["[1]<stdout>:hi 1"]


def test_unchanged_ddp_script_runs_and_two_jobs_at_once_do_not_collide():
    # One test for both: each of the two concurrent jobs must run the DDP script exactly as a lone job would.
    jobs = [start_job("run", "-np", "2", *python_script("ddp_minimal.py")) for _ in range(2)]
    for number, (process, marker) in enumerate(jobs):
        stdout, stderr = process.communicate(timeout=120)
        result = JobResult(process.returncode, stdout, stderr, marker)
        assert result.returncode == 0, f"job {number} of two running at once failed:\n{stderr}"
        assert result.lines("stdout", 0) == ["ddp ok rank=0 world=2"], f"job {number}: the DDP script\n{stdout}"
        assert result.lines("stdout", 1) == ["ddp ok rank=1 world=2"], f"job {number}: the DDP script\n{stdout}"


def test_failing_rank_ends_job_with_summary_and_no_leftovers():
    result = run_job("run", "-np", "3", *python_script("exit_code.py"))
    assert result.returncode == 3
    assert "rank 1" in result.stderr and "exited with code 3" in result.stderr
    summary = result.stderr.split("torchring run: rank 1 ")[1]
    assert "its last line: rank 1 failing on purpose" in summary
    children = [int(pid) for pid in re.findall(r"started child (\d+)", result.stdout)]
    assert len(children) == 3
    assert wait_until_gone(result.marker) == []


def test_sigkill_of_one_rank_ends_the_job():
    process, marker = start_job("run", "-np", "2", *python_script("sleeper.py"))
    pids = _wait_for_ready(process, 2)
    os.kill(pids[1], signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "was killed by signal 9 (SIGKILL)" in stderr
    assert wait_until_gone(marker) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_stops_every_rank(signum):
    process, marker = start_job("run", "-np", "2", *python_script("sleeper.py"))
    pids = _wait_for_ready(process, 2)
    # processes_with_marker must see the live ranks, or wait_until_gone below would prove nothing
    assert set(pids) <= set(processes_with_marker(marker)), "processes_with_marker misses live ranks"
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    assert signal.Signals(signum).name in stderr
    assert wait_until_gone(marker) == []


def test_launcher_killed_outright_takes_its_ranks_along():
    process, marker = start_job("run", "-np", "2", *python_script("sleeper.py"))
    _wait_for_ready(process, 2)
    process.kill()
    process.communicate(timeout=30)
    assert wait_until_gone(marker) == []


@pytest.mark.parametrize("args,message", [
    (["-np", "2", "-H", "localhost:0", "true"], "0 slots"),
    (["-np", "2", "-H", "localhost:x", "true"], "positive integer"),
    (["-np", "2", "-H", "localhost:1,localhost:1", "true"], "listed twice"),
    (["-np", "1", "-H", "a b", "true"], "malformed"),
    (["-np", "1"], "no command"),
])
def test_bad_input_is_a_one_line_error(args, message, no_job_starts, capsys):
    # the command line as `torchring run` parses it, in this process: the error comes before any rank starts
    assert cli.main(["run", *args]) != 0
    stderr = capsys.readouterr().err
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize("args,message", [
    (["-np", "3", "-H", "localhost:2", "true"], "-np 3 asks for more ranks than the 2 slots"),
    (["-np", "1", "no-such-program-xyz"], "command not found"),
])
def test_bad_input_found_by_the_launcher_is_a_one_line_error(args, message):
    # found when the launcher assigns or starts the ranks, so these run the real command
    result = run_job("run", *args)
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_unknown_flag_is_a_usage_error(no_job_starts, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--no-such-flag", "-np", "1", "true"])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert "unrecognized arguments" in stderr or "error" in stderr


def _wait_for_ready(process, count: int, timeout: float = 60) -> list[int]:
    pids = []
    deadline = time.monotonic() + timeout
    while len(pids) < count:
        assert time.monotonic() < deadline, "ranks did not start"
        line = process.stdout.readline()
        match = re.search(r"ready pid=(\d+)", line)
        if match:
            pids.append(int(match.group(1)))
    return pids


def test_busy_port_is_a_clear_error():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = run_job("run", "-np", "1", "--port", str(busy.getsockname()[1]), "true")
    assert result.returncode != 0
    assert "cannot serve the rendezvous store" in result.stderr and "--port" in result.stderr


def test_given_port_becomes_master_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_job("run", "-np", "1", "--port", str(port), "python", "-c",
                     "import os; print(os.environ['MASTER_PORT'])")
    assert result.returncode == 0
    assert result.lines("stdout", 0) == [str(port)]


def test_tuning_flags_become_variables_of_every_rank():
    result = run_job("run", "-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--cache-capacity",
                     "0", "--no-stall-check", "--stall-check-warning-time-seconds", "9", "--log-level", "debug",
                     "python", "-c", "import os; print(sorted((k, v) for k, v in os.environ.items() "
                     "if k.startswith('TORCHRING_') and k[10:] in ('FUSION_THRESHOLD', 'CYCLE_TIME', "
                     "'CACHE_CAPACITY', 'STALL_CHECK_DISABLE', 'STALL_CHECK_TIME_SECONDS', 'LOG_LEVEL')))")
    assert result.returncode == 0, result.stderr
    expected = str(sorted([("TORCHRING_FUSION_THRESHOLD", str(32 * 1024 * 1024)), ("TORCHRING_CYCLE_TIME", "2.5"),
                           ("TORCHRING_CACHE_CAPACITY", "0"), ("TORCHRING_STALL_CHECK_DISABLE", "1"),
                           ("TORCHRING_STALL_CHECK_TIME_SECONDS", "9.0"), ("TORCHRING_LOG_LEVEL", "DEBUG")]))
    assert result.lines("stdout", 0) == [expected] and result.lines("stdout", 1) == [expected]


def test_bad_tuning_value_fails_at_init_naming_the_variable():
    result = run_job("run", "-np", "1", sys.executable, "-c", "import torchring as hvd; hvd.init()",
                     env={"HOROVOD_CYCLE_TIME": "fast"})
    assert result.returncode != 0
    assert "HOROVOD_CYCLE_TIME" in result.stderr
