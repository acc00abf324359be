"""Tests of the multi-host test cluster itself: names, reachability, process accounting, the venv."""

from __future__ import annotations

import subprocess
import sys

from .cluster import Cluster


def test_hostnames(cluster: Cluster) -> None:
    for host in cluster.hosts:
        result = cluster.run_on(host, "hostname")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == host.name


def test_plain_ssh_through_path_wrapper(cluster: Cluster) -> None:
    result = subprocess.run(["ssh", "h2", "--", "hostname"], env=cluster.env(), capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "h2"


def test_hosts_resolve_and_reach_each_other(cluster: Cluster) -> None:
    h1, h2 = cluster.hosts[:2]
    code = (
        "import socket; "
        f"assert socket.gethostbyname('h2') == {h2.address!r}; "
        f"socket.create_connection(({h2.address!r}, 22), timeout=5).close(); print('ok')"
    )
    result = cluster.run_on(h1, "python3", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_no_process_left_after_a_command(cluster: Cluster) -> None:
    h1 = cluster.hosts[0]
    result = cluster.run_on(h1, "sleep", "0.1")
    assert result.returncode == 0, result.stderr
    assert cluster.wait_until_empty(h1) == []
    assert cluster.sshd_pid(h1) is not None


def test_kill_all_in_removes_background_processes(cluster: Cluster) -> None:
    h2 = cluster.hosts[1]
    # setsid + closed descriptors: the sleep outlives the ssh session, like a leaked rank would
    result = cluster.run_on(h2, "sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 &")
    assert result.returncode == 0, result.stderr
    assert cluster.pids_in(h2), "the background sleep should still be running on h2"
    cluster.kill_all_in(h2)
    assert cluster.pids_in(h2) == []
    assert cluster.run_on(h2, "hostname").stdout.strip() == "h2", "sshd must survive kill_all_in"


def test_venv_python_runs_remotely(cluster: Cluster) -> None:
    result = cluster.run_on(cluster.hosts[0], sys.executable, "-c",
                            "import socket, torch, torchring; print(socket.gethostname())", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "h1"
