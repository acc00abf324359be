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
        return ["env", "RAY_USAGE_STATS_ENABLED=0", f"HOME={home}", f"PATH={os.environ['PATH']}"]

    def _ray(self, node: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        (self.state_dir / node).mkdir(parents=True, exist_ok=True)
        return self.cluster.run_on(node, *self._environment(), str(RAY), *argv, timeout=timeout)

    def start(self) -> None:
        for node in self.nodes:
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
        variables = [f"{name}={value}" for name, value in (env or {}).items()]
        return self.cluster.run_on(self.head, *self._environment(), f"RAY_ADDRESS={self.address}",
                                   f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", *variables, sys.executable, *argv,
                                   timeout=timeout)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self._ray(node, "stop", "--force", timeout=60)
            self.cluster.kill_all_in(node)
        for node in self.nodes:
            self.cluster.wait_until_empty(node, timeout=10)
