"""torchring.run(fn) from a script, --check-build and --config-file through the real command."""

import json
import subprocess
import sys

from torchring.cli import main

from .jobs import ROOT, SCRIPTS, run_job


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


def test_elastic_job_on_this_host(tmp_path):
    script = ROOT / "tests" / "multihost" / "scripts" / "elastic_train.py"
    log = tmp_path / "committed.jsonl"
    result = run_job("run", "--min-np", "2", "--max-np", "2", "-H", "localhost:2", sys.executable, str(script),
                     env={"ELASTIC_LOG": str(log), "ELASTIC_EPOCHS": "1", "ELASTIC_STEP_SLEEP": "0"})
    assert result.returncode == 0, result.stderr
    assert "elastic job started with 2 workers on localhost" in result.stderr
    finals = sorted(line for line in result.stdout.splitlines() if "final rank" in line)
    assert len(finals) == 2 and len({line.split("checksum")[1] for line in finals}) == 1
    indices = [i for line in log.read_text().splitlines() for i in json.loads(line)["indices"]]
    assert sorted(indices) == list(range(240))
