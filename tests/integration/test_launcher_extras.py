"""torchring.run(fn) from a script, --check-build and --config-file through the real command."""

import json
import subprocess
import sys

from torchring.cli import main

from .elastic_jobs import samples_processed_twice
from .jobs import ROOT, SCRIPTS, run_job, start_job


def test_run_function_returns_results_in_rank_order_and_reports_failures():
    result = subprocess.run([sys.executable, str(SCRIPTS / "run_function.py")], cwd=ROOT, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULTS "))
    results = json.loads(line[len("RESULTS "):])
    assert [r["rank"] for r in results] == [0, 1, 2] and all(r["value"] == 7.0 for r in results)
    assert "FAILED 1" in result.stdout
    assert "ZeroDivisionError" in result.stderr


def test_check_build_lists_what_is_available(capsys):
    assert main(["run", "--check-build"]) == 0
    out = capsys.readouterr().out
    assert "[X] PyTorch" in out and "[X] Gloo" in out and "[ ] MPI" in out


def test_config_file_sets_flags_and_command_line_wins(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("np: 2\nparams: {cycle_time_ms: 4}\nenv: {JOB_MODE: from file}\n")
    code = "import os; print(os.environ['TORCHRING_CYCLE_TIME'], os.environ['JOB_MODE'], os.environ['WORLD_SIZE'])"
    result = run_job("run", "--config-file", str(config), "--env", "JOB_MODE=from flag", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.lines("stdout", 0) == ["4.0 from flag 2"] and result.lines("stdout", 1) == ["4.0 from flag 2"]


def test_unknown_config_file_key_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("np: 2\nfusion: 3\n")
    assert main(["run", "--config-file", str(bad), "true"]) == 2  # refused before any rank starts
    assert "unknown key 'fusion'" in capsys.readouterr().err


def test_elastic_job_on_this_host_honours_output_filename_ranks_and_verbose(tmp_path):
    script = ROOT / "tests" / "multihost" / "scripts" / "elastic_train.py"
    log, out = tmp_path / "committed.jsonl", tmp_path / "out"
    result = run_job("run", "--min-np", "2", "--max-np", "2", "-H", "localhost:2", "--output-filename", str(out),
                     "--ranks", "1", "--verbose", sys.executable, str(script),
                     env={"ELASTIC_LOG": str(log), "ELASTIC_EPOCHS": "1", "ELASTIC_STEP_SLEEP": "0"})
    assert result.returncode == 0, result.stderr
    assert "elastic job started with 2 workers on localhost" in result.stderr
    assert "elastic job: --min-np 2, --max-np 2, rendezvous port" in result.stderr
    assert "worker w0 started on localhost (pid" in result.stderr and "worker w1 started on localhost" in result.stderr
    # --ranks 1: only the worker holding rank 1 reaches the console; every worker's output is in its files
    assert all(line.startswith("[w1]<") for line in (result.stdout + result.stderr).splitlines()
               if line.startswith("[w"))
    finals = [(out / f"worker.{n}" / "stdout").read_text() for n in (0, 1)]
    assert "final rank 0 size 2" in finals[0] and "final rank 1 size 2" in finals[1]
    assert "progress epoch 0 batch 0 size 2" in finals[0] and (out / "worker.1" / "stderr").exists()
    checksums = {text.split("checksum")[1].strip() for text in finals}
    assert len(checksums) == 1
    assert samples_processed_twice(log, epochs=1) == {0: 0}  # every sample once


def test_workers_stranded_when_training_ends_are_stopped(tmp_path):
    """A worker started for a new generation just as the others finished training waits in hvd.init()
    for peers that will never come: the launcher stops it instead of waiting for --elastic-timeout."""
    pool, flag = tmp_path / "pool", tmp_path / "w1-started"
    pool.write_text("localhost:1\n")
    code = ("import os, pathlib, sys, time; flag = pathlib.Path(sys.argv[1]); first = "
            "os.environ['TORCHRING_WORKER_ID'] == 'w0'\n"
            "if not first: flag.touch()\n"
            "import torchring as hvd; hvd.init(); print('ready', flush=True)\n"
            "while first and not flag.exists(): time.sleep(0.02)\n")
    process, _ = start_job("run", "--min-np", "1", "--max-np", "2", "--host-discovery-script", f"cat {pool}",
                           "--elastic-timeout", "300", sys.executable, "-c", code, str(flag))
    assert process.stdout.readline().strip() == "[w0]<stdout>:ready"
    pool.write_text("localhost:2\n")
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"the job did not end: {process.communicate()[1][-2000:]}") from None
    assert process.returncode == 0, stderr
    assert "membership changed: 1 -> 2 workers (worker started on localhost)" in stderr
    assert "worker w1 on localhost stopped: training ended before generation 1 could start" in stderr
    assert "1 worker(s) completed training" in stderr
