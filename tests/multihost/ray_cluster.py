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
from pathlib import Path

from .cluster import Cluster

RAY = Path(sys.executable).with_name("ray")
HEAD_PORT = 6379
#: The head notices a dead node after 3 failed health checks 1 s apart (Ray's default: 5, 3 s apart), so that
#: the lost-node test does not wait for Ray longer than for torchring.
FAST_NODE_DEATH = ("RAY_health_check_period_ms=1000", "RAY_health_check_failure_threshold=3")
#: No worker processes started ahead for each new driver (Ray's default): the tests' drivers that only ask the
#: head something would start two Python workers per node for nothing; workers still start when an actor needs one.
NO_PRESTART = ("RAY_prestart_worker_first_driver=0",)


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
        self._lost: set[str] = set()

    def _environment(self) -> list[str]:
        """``env`` arguments for every Ray process: usage reporting off, and a home of the cluster's own, so
        that nothing of the user's ``~/.ray`` (an auth token from another cluster) reaches it."""
        home = self.state_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        return ["env", "RAY_USAGE_STATS_ENABLED=0", f"HOME={home}", f"PATH={os.environ['PATH']}", *FAST_NODE_DEATH,
                *NO_PRESTART]

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
        """A node lost: SIGKILL every process on ``node`` (its raylet and every actor there). The next driver
        started brings it back first (:meth:`_bring_back_lost_nodes`), so a test that ends the module does not
        pay for a restart nobody uses."""
        self.cluster.kill_all_in(node)
        self._lost.add(node)

    def _bring_back_lost_nodes(self) -> None:
        """Restart every killed worker node and wait until the head lists every node alive again."""
        if not self._lost:
            return
        for node in sorted(self._lost):
            self.cluster.kill_all_in(node)
            self.start_node(node)
        self._lost.clear()
        self.wait_for_nodes(len(self.nodes))

    def wait_for_nodes(self, count: int, timeout: float = 60) -> None:
        """Until the head lists ``count`` nodes alive: one driver process that asks every 0.5 s (each new driver
        costs seconds of CPU to load Ray and connect)."""
        code = ("import time, ray\n"
                "ray.init(address='auto', logging_level='ERROR')\n"
                f"deadline = time.monotonic() + {timeout}\n"
                "while True:\n"
                "    alive = sum(1 for n in ray.nodes() if n['Alive'])\n"
                f"    if alive == {count} or time.monotonic() > deadline:\n"
                "        print(alive)\n"
                "        break\n"
                "    time.sleep(0.5)\n")
        result = self.driver(["-c", code], timeout=timeout + 60, bring_back=False)
        lines = result.stdout.strip().splitlines()
        alive = int(lines[-1]) if lines and lines[-1].isdigit() else None
        if alive != count:
            raise RuntimeError(f"{alive} of {count} Ray nodes alive after {timeout:g} s: {result.stderr[-2000:]}")

    def driver(self, argv: list[str], timeout: float = 180, env: dict[str, str] | None = None,
               bring_back: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``python argv`` on the head node as a driver of this cluster (``RAY_ADDRESS`` set)."""
        if bring_back:
            self._bring_back_lost_nodes()
        return self.cluster.run_on(self.head, *self._driver_argv(argv, env), timeout=timeout)

    def start_driver(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """:meth:`driver`, running in the background (text output piped)."""
        self._bring_back_lost_nodes()
        return subprocess.Popen(self.cluster.ssh_command(self.head, *self._driver_argv(argv, env)),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _driver_argv(self, argv: list[str], env: dict[str, str] | None) -> list[str]:
        variables = [f"{name}={value}" for name, value in (env or {}).items()]
        # RAY_DEDUP_LOGS=0: the driver prints every worker's lines; by default it folds lines that differ only
        # in their digits ("HVD rank=0 ... host=h1" and "HVD rank=1 ... host=h2") into "[repeated 2x]"
        return [*self._environment(), f"RAY_ADDRESS={self.address}", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}",
                "RAY_DEDUP_LOGS=0", *variables, sys.executable, *argv]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self._ray(node, "stop", "--force", timeout=60)
            self.cluster.kill_all_in(node)
        for node in self.nodes:
            self.cluster.wait_until_empty(node, timeout=10)
