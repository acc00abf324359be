"""A real Ray cluster on the namespace hosts: the head on ``h1``, a worker node on each other host.

Each node is started with ``ray start`` over ``ssh hN``, so it runs in that host's namespaces (its
address, its host name); each has its own temporary directory under the state directory. Drivers run
on ``h1`` (Ray wants its drivers on a node of the cluster). Needs ``ray`` in this environment
(``pip install 'torchring[ray]'``; the test extra installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from .cluster import Cluster

RAY = Path(sys.executable).with_name("ray")
HEAD_PORT = 6379
#: The head notices a dead node after 3 failed health checks 1 s apart (Ray's default: 5, 3 s apart), so that
#: the lost-node test does not wait for Ray longer than for torchring.
FAST_NODE_DEATH = ("RAY_health_check_period_ms=1000", "RAY_health_check_failure_threshold=3")


def ray_unavailable_reason() -> str | None:
    """Why this machine cannot run the test Ray cluster, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'torchring[ray]')"
    if not RAY.exists():
        return f"no {RAY}"
    return None


class RayCluster:
    """``ray start --head`` on the first host and ``ray start --address`` on the others; :meth:`stop` ends them."""

    def __init__(self, cluster: Cluster, state_dir: Path, nodes: list[str], cpus_per_node: int = 2) -> None:
        self.cluster, self.state_dir, self.nodes, self.cpus = cluster, state_dir, nodes, cpus_per_node
        self.head = nodes[0]
        self.address = f"{cluster.host(self.head).address}:{HEAD_PORT}"

    def _environment(self) -> list[str]:
        """``env`` arguments for every Ray process: usage reporting off, and a home of the cluster's own, so
        that nothing of the user's ``~/.ray`` (an auth token from another cluster) reaches it."""
        home = self.state_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        return ["env", "RAY_USAGE_STATS_ENABLED=0", f"HOME={home}", f"PATH={os.environ['PATH']}", *FAST_NODE_DEATH]

    def _ray(self, node: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        (self.state_dir / node).mkdir(parents=True, exist_ok=True)
        return self.cluster.run_on(node, *self._environment(), str(RAY), *argv, timeout=timeout)

    def start(self) -> None:
        for node in self.nodes:
            self.start_node(node)
        self.wait_for_nodes(len(self.nodes))

    def start_node(self, node: str) -> None:
        """``ray start`` on ``node``: the head, or a worker node joining it."""
        address = self.cluster.host(node).address
        common = [f"--node-ip-address={address}", f"--num-cpus={self.cpus}", "--disable-usage-stats"]
        if node == self.head:
            argv = ["start", "--head", f"--port={HEAD_PORT}", "--include-dashboard=false",
                    f"--temp-dir={self.state_dir / node}", *common]
        else:
            argv = ["start", f"--address={self.address}", *common]
        result = self._ray(node, *argv)
        if result.returncode != 0:
            raise RuntimeError(f"ray start on {node} failed ({result.returncode}):\n{result.stdout}\n"
                               f"{result.stderr}")


    def kill_node(self, node: str) -> None:
        """A node lost: SIGKILL every process on ``node`` (its raylet and every actor there)."""
        self.cluster.kill_all_in(node)

    def restart_node(self, node: str) -> None:
        """Bring a killed worker node back and wait until the head lists every node alive again."""
        self.cluster.kill_all_in(node)
        self.start_node(node)
        self.wait_for_nodes(len(self.nodes))

    def wait_for_nodes(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            alive = self.alive_nodes()
            if alive == count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{alive} of {count} Ray nodes alive after {timeout:g} s")
            time.sleep(0.5)

    def alive_nodes(self) -> int:
        code = ("import ray; ray.init(address='auto', logging_level='ERROR'); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))")
        result = self.driver(["-c", code], timeout=60)
        try:
            return int(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def driver(self, argv: list[str], timeout: float = 180, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
        """Run ``python argv`` on the head node as a driver of this cluster (``RAY_ADDRESS`` set)."""
        return self.cluster.run_on(self.head, *self._driver_argv(argv, env), timeout=timeout)

    def start_driver(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """:meth:`driver`, running in the background (text output piped)."""
        return subprocess.Popen(self.cluster.ssh_command(self.head, *self._driver_argv(argv, env)),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _driver_argv(self, argv: list[str], env: dict[str, str] | None) -> list[str]:
        variables = [f"{name}={value}" for name, value in (env or {}).items()]
        return [*self._environment(), f"RAY_ADDRESS={self.address}", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}",
                *variables, sys.executable, *argv]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self._ray(node, "stop", "--force", timeout=60)
            self.cluster.kill_all_in(node)
        for node in self.nodes:
            self.cluster.wait_until_empty(node, timeout=10)
