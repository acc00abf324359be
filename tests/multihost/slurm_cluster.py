"""A real Slurm cluster on the namespace hosts: Debian's ``slurmctld`` on ``h1`` and one ``slurmd`` per node.

``munged`` runs once, in the root namespace, with a fresh key and its socket in the state directory (a
file socket works from every namespace host, which all share the file system); ``slurm.conf`` points
every daemon and client at it. Each daemon is started over ``ssh hN``, so it runs in that host's
network, UTS and mount namespaces: ``slurmd`` on ``h2`` is node ``h2``, listening at ``10.78.0.3``.
Clients (``srun``, ``sbatch``, ``sinfo``) run on a host the same way, with ``SLURM_CONF`` set.
Needs Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` (``make test-deps`` installs them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .cluster import Cluster

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd",
           "srun": "/usr/bin/srun"}


def slurm_unavailable_reason() -> str | None:
    """Why this machine cannot run the test Slurm cluster, or None."""
    missing = [name for name, path in DAEMONS.items() if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root"
    return None


class SlurmCluster:
    """``slurmctld`` on the first node and ``slurmd`` on every node; :meth:`stop` ends them all."""

    def __init__(self, cluster: Cluster, state_dir: Path, nodes: list[str], cpus_per_node: int = 4) -> None:
        self.cluster, self.state_dir, self.nodes = cluster, state_dir, nodes
        self.controller = nodes[0]
        self.conf = state_dir / "slurm.conf"
        self.munge_socket = state_dir / "munge" / "munge.socket"
        self._munged: int | None = None
        self._write_config(cpus_per_node)

    # ------------------------------------------------------------------ set-up

    def _write_config(self, cpus_per_node: int) -> None:
        state = self.state_dir
        for name in ("ctld", "munge", "log"):
            (state / name).mkdir(parents=True, exist_ok=True)
        addresses = {node: self.cluster.host(node).address for node in self.nodes}
        lines = [
            "ClusterName=torchring",
            f"SlurmctldHost={self.controller}({addresses[self.controller]})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={state / 'ctld'}",
            f"SlurmdSpoolDir={state / 'spool-%n'}",
            f"SlurmctldPidFile={state / 'slurmctld.pid'}",
            f"SlurmdPidFile={state / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={state / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={state / 'log' / 'slurmd-%n.log'}",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # the nodes share this machine's cores: declare more than it has
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "SlurmdTimeout=10",
            "SlurmctldTimeout=10",
            "MessageTimeout=10",
            "InactiveLimit=0",
            "KillWait=3",
            "MinJobAge=2",
            "PlugStackConfig=/dev/null",
            *(f"NodeName={node} NodeAddr={addresses[node]} CPUs={cpus_per_node} State=UNKNOWN" for node in self.nodes),
            f"PartitionName=main Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        for node in self.nodes:
            (state / f"spool-{node}").mkdir(exist_ok=True)
        # ``ip netns exec`` gives each host a fresh /sys without the cgroup mounts, and slurmd 22.05 needs a cgroup
        # hierarchy even where no plugin uses one: the root namespace's, seen through pid 1's root
        (state / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/proc/1/root/sys/fs/cgroup\n")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The cluster's client environment (``SLURM_CONF``) on top of :meth:`Cluster.env`."""
        env = self.cluster.env(base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def start(self, timeout: float = 60.0) -> None:
        """Start munged, slurmctld and every slurmd, and wait until every node is idle."""
        self._start_munged()
        self._on(self.controller, DAEMONS["slurmctld"], "-f", str(self.conf))
        for node in self.nodes:
            self._on(node, DAEMONS["slurmd"], "-f", str(self.conf))
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if states and all(state == "idle" for state in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle within {timeout:g} s: {states}\n{self.logs()}")
            time.sleep(0.2)

    def _start_munged(self) -> None:
        key = self.state_dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        argv = [DAEMONS["munged"], "--force", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={self.state_dir / 'munge' / 'munged.pid'}",
                f"--log-file={self.state_dir / 'log' / 'munged.log'}",
                f"--seed-file={self.state_dir / 'munge' / 'munged.seed'}"]
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        self._munged = process.pid
        deadline = time.monotonic() + 15
        while not self.munge_socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._read(self.state_dir / 'log' / 'munged.log')}")
            time.sleep(0.05)

    def _on(self, node: str, *argv: str) -> None:
        result = self.cluster.run_on(node, "env", f"SLURM_CONF={self.conf}", *argv, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} on {node} failed ({result.returncode}): {result.stderr}\n{self.logs()}")

    # ------------------------------------------------------------------ use

    def client(self, node: str, *argv: str) -> list[str]:
        """The argv that runs a Slurm client command on ``node`` (through the cluster's ssh)."""
        return self.cluster.ssh_command(node, "env", f"SLURM_CONF={self.conf}", f"PATH={os.environ['PATH']}", *argv)

    def run(self, node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.client(node, *argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, env=self.env())

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` reports it (``idle``, ``alloc``, ``down*``...)."""
        result = self.run(self.controller, "sinfo", "--noheader", "--Node", "--format=%N %t", timeout=30)
        states = {}
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def logs(self) -> str:
        paths = sorted((self.state_dir / "log").glob("*"))
        return "\n".join(f"--- {path.name}\n{self._read(path)[-2000:]}" for path in paths)

    # ------------------------------------------------------------------ tear-down

    def stop(self) -> None:
        """End every job, daemon and step process this cluster started."""
        for node in self.nodes:
            self.cluster.kill_all_in(node)
        if self._munged is not None:
            try:
                os.killpg(self._munged, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._munged = None
        for node in self.nodes:
            self.cluster.wait_until_empty(node, timeout=10)

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""
