"""``torchring run`` across hosts over real SSH: network namespaces h1, h2 with their own sshd."""

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import torchring

from .cluster import unreachable_address

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
DDP_SCRIPT = ROOT / "tests" / "integration" / "scripts" / "ddp_minimal.py"
AWKWARD = ["a b", "it's", 'say "hi"', "$HOME", "x; touch /tmp/torchring-pwned", "`id`"]


def launcher(*args):
    return [sys.executable, "-m", "torchring.cli", "run", *args]


def run(cluster, *args, env=None, timeout=120):
    return subprocess.run(launcher(*args), cwd=ROOT, env=cluster.env({**os.environ, **(env or {})}),
                          capture_output=True, text=True, timeout=timeout)


def rank_reports(stdout):
    reports = {}
    for line in stdout.splitlines():
        _, _, payload = line.partition(">:")
        if payload.startswith("{"):
            data = json.loads(payload)
            reports[data["rank"]] = data
    return reports


def assert_hosts_empty(cluster):
    for host in cluster.hosts:
        assert cluster.wait_until_empty(host, timeout=10) == [], f"processes left on {host.name}"


def test_four_ranks_on_two_hosts_with_awkward_arguments(cluster):
    result = run(cluster, "-np", "4", "-H", "h1:2,h2:2", sys.executable, str(SCRIPTS / "hvd_ranks.py"), *AWKWARD,
                 env={"TR_TEST_VALUE": "not forwarded"})
    assert result.returncode == 0, result.stderr
    reports = rank_reports(result.stdout)
    assert sorted(reports) == [0, 1, 2, 3]
    assert [reports[r]["host"] for r in range(4)] == ["h1", "h1", "h2", "h2"]
    assert [reports[r]["local_rank"] for r in range(4)] == [0, 1, 0, 1]
    assert [reports[r]["cross_rank"] for r in range(4)] == [0, 0, 1, 1]
    assert all(report["sum"] == 10.0 and report["size"] == 4 for report in reports.values())
    assert all(report["argv"] == AWKWARD for report in reports.values())
    assert all(report["env"] is None and report["cwd"] == str(ROOT) for report in reports.values())
    assert not Path("/tmp/torchring-pwned").exists()
    assert_hosts_empty(cluster)


def test_hostfile_output_files_env_and_a_local_rank(cluster, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the launcher's own host first\nlocalhost slots=1\n\nh2 slots=2  # two there\n")
    out = tmp_path / "logs"
    result = run(cluster, "-np", "3", "--hostfile", str(hostfile), "--output-filename", str(out), "--ranks", "0",
                 "-x", "TR_TEST_VALUE", sys.executable, str(SCRIPTS / "hvd_ranks.py"), env={"TR_TEST_VALUE": "v 1"})
    assert result.returncode == 0, result.stderr
    assert sorted(rank_reports(result.stdout)) == [0]  # --ranks 0 on the console
    for rank in range(3):
        data = json.loads((out / f"rank.{rank}" / "stdout").read_text().splitlines()[0])
        assert data["rank"] == rank and data["sum"] == 6.0 and data["env"] == "v 1"
        assert (out / f"rank.{rank}" / "stderr").exists()
    assert json.loads((out / "rank.1" / "stdout").read_text())["host"] == "h2"
    assert_hosts_empty(cluster)


def test_ddp_script_across_hosts(cluster):
    result = run(cluster, "-np", "4", "-H", "h1:2,h2:2", sys.executable, str(DDP_SCRIPT))
    assert result.returncode == 0, result.stderr
    for rank in range(4):
        assert f"ddp ok rank={rank} world=4" in result.stdout
    assert_hosts_empty(cluster)


def test_unreachable_host_fails_preflight_and_starts_nothing(cluster):
    start = time.monotonic()
    result = run(cluster, "-np", "2", "-H", f"h1:1,{unreachable_address}:1", "--start-timeout", "4",
                 sys.executable, str(SCRIPTS / "hvd_ranks.py"))
    elapsed = time.monotonic() - start
    assert result.returncode == 1
    assert f"host {unreachable_address}:" in result.stderr and "no rank was started" in result.stderr
    assert elapsed < 15
    assert result.stdout == ""
    assert_hosts_empty(cluster)


def test_version_mismatch_lists_each_hosts_versions(cluster, tmp_path):
    fake = tmp_path / "python"
    report = {"python": platform.python_version(), "torch": "1.13.1", "torchring": torchring.__version__,
              "store_reachable": True, "cpus": 1}
    fake.write_text(f"""#!/bin/sh
if [ "$(hostname)" = h2 ] && [ "$2" = torchring.launch.spawn.host_probe ]; then
    echo '{json.dumps(report)}'; exit 0
fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    result = run(cluster, "-np", "2", "-H", "h1:1,h2:1", "--python", str(fake), sys.executable,
                 str(SCRIPTS / "hvd_ranks.py"))
    assert result.returncode == 1
    assert "different versions" in result.stderr
    assert f"h2: Python {platform.python_version()}, torch 1.13.1" in result.stderr
    assert f"this host: Python {platform.python_version()}, torch {torch.__version__}" in result.stderr
    assert "h1:" not in result.stderr.split("different versions")[1]
    assert_hosts_empty(cluster)


def test_sigkill_of_a_remote_rank_ends_the_job_everywhere(cluster):
    start = time.monotonic()
    result = run(cluster, "-np", "4", "-H", "h1:2,h2:2", "-x", "TR_TEST_MODE", sys.executable,
                 str(SCRIPTS / "hvd_ranks.py"), env={"TR_TEST_MODE": "kill"}, timeout=60)
    assert time.monotonic() - start < 30
    assert result.returncode != 0
    assert "rank 3 (on h2) was killed by signal 9 (SIGKILL)" in result.stderr, result.stderr
    assert_hosts_empty(cluster)


def test_sigterm_to_the_launcher_ends_the_job_everywhere(cluster):
    process = subprocess.Popen(launcher("-np", "4", "-H", "h1:2,h2:2", "--env", "TR_TEST_MODE=hang", sys.executable,
                                        str(SCRIPTS / "hvd_ranks.py")),
                               cwd=ROOT, env=cluster.env(dict(os.environ)),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = 0
    deadline = time.monotonic() + 60
    while ready < 4 and time.monotonic() < deadline:
        line = process.stdout.readline()
        ready += line.rstrip().endswith(">:ready")
    assert ready == 4
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=15)
    assert process.returncode != 0
    assert "received SIGTERM" in process.stderr.read()
    assert_hosts_empty(cluster)


def _accuracy(stdout):
    import re

    found = re.findall(r"Accuracy: ([\d.]+)", stdout)
    assert found, stdout[-2000:]
    return float(found[-1])


def test_mnist_example_across_hosts_matches_a_local_run(cluster, local_mnist_run):
    example = [sys.executable, str(ROOT / "examples" / "mnist.py"), "--epochs", "1", "--log-interval", "5"]
    remote = run(cluster, "-np", "2", "-H", "h1:1,h2:1", *example, timeout=400)
    assert remote.returncode == 0, remote.stderr
    local = local_mnist_run
    assert local.returncode == 0, local.stderr
    assert abs(_accuracy(remote.stdout) - _accuracy(local.stdout)) < 0.02
    assert _accuracy(remote.stdout) > 0.12  # above chance (0.1) after one short epoch at 2 ranks
    assert_hosts_empty(cluster)


def test_run_function_across_hosts(cluster):
    script = ROOT / "tests" / "integration" / "scripts" / "run_function.py"
    result = subprocess.run([sys.executable, str(script), "h1:2,h2:1"], cwd=ROOT, env=cluster.env(dict(os.environ)),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULTS "))
    results = json.loads(line[len("RESULTS "):])
    assert [(r["rank"], r["host"], r["value"]) for r in results] == [(0, "h1", 7.0), (1, "h1", 7.0), (2, "h2", 7.0)]
    assert "FAILED 1" in result.stdout
    assert_hosts_empty(cluster)


def test_config_file_with_hosts(cluster, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("np: 2\nhosts: [h1:1, h2:1]\nstart-timeout: 20\n")
    result = run(cluster, "--config-file", str(config), sys.executable, str(SCRIPTS / "hvd_ranks.py"))
    assert result.returncode == 0, result.stderr
    assert [r["host"] for _, r in sorted(rank_reports(result.stdout).items())] == ["h1", "h2"]
    assert_hosts_empty(cluster)
