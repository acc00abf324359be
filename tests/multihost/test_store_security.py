"""The job's store across hosts: it listens only on the address the hosts reach this one at (with a
rank on this host that still finds it), the job's secret is on no command line of any host, and a
record forged from another host of the cluster changes nothing: the summary still blames the rank that
failed."""

from __future__ import annotations

import os
import signal
import sys
import time

from .cluster import GATEWAY
from .test_hangs_and_partitions import _Job
from .test_multihost_launch import SCRIPTS, assert_hosts_empty

FORGE = """
import sys
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=timedelta(seconds=10))
store.set("torchring/peer_failure/2", b"forged: rank 0 is to blame")
print("forged", flush=True)
"""


def _listening(port: int) -> list[str]:
    """The local addresses of this machine's IPv4 sockets listening on ``port``."""
    found = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_the_store_listens_where_the_hosts_reach_it_and_forged_records_change_nothing(cluster):
    job = _Job(cluster, "-np", "3", "-H", "localhost:1,h1:1,h2:1", "--verbose", "--env", "TR_TEST_MODE=hang",
               sys.executable, str(SCRIPTS / "hvd_ranks.py"))
    port = int(job.wait_for(r"rendezvous port (\d+)", "stderr").group(1))
    for rank in range(3):
        job.wait_for(rf"\[{rank}\]<stdout>:ready")
    try:
        assert _listening(port) == [GATEWAY]  # the bridge address h1 and h2 reach; the local rank found it too
        secret = _secret_of(_pid_of_rank(cluster, "h1"))
        assert len(secret) == 64 and not any(secret in command for command in _command_lines())
        forged = cluster.run_on("h3", sys.executable, "-c", FORGE, GATEWAY, str(port))
        assert forged.returncode == 0 and "forged" in forged.stdout, forged.stderr
        os.kill(_pid_of_rank(cluster, "h2"), signal.SIGKILL)
    finally:
        returncode = job.finish(timeout=60)
    stderr = job.text["stderr"]
    assert returncode != 0
    assert "rank 2 (on h2) was killed by signal 9 (SIGKILL)" in stderr, stderr
    assert "forged" not in stderr.split("torchring run: rank 2")[1], stderr
    assert "ignoring the value of 'torchring/peer_failure/2'" in stderr, stderr
    assert_hosts_empty(cluster)


def _secret_of(pid: int) -> str:
    """The job secret a rank was started with (its initial environment, as /proc keeps it)."""
    environment = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return next(entry.split(b"=", 1)[1].decode() for entry in environment
                if entry.startswith(b"TORCHRING_JOB_SECRET="))


def _command_lines() -> list[str]:
    """Every process's command line on this machine (the cluster's hosts included)."""
    lines = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                lines.append(open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace"))
            except OSError:
                continue
    return lines


def _pid_of_rank(cluster, host: str) -> int:
    """The pid of the job's Python rank on ``host`` (the hosts share this machine's pid namespace)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in cluster.pids_in(host):
            try:
                command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"hvd_ranks.py") for part in command):
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no rank found on {host}")
