"""Elastic workers as Ray actors, behind the same ``Worker`` records the elastic driver keeps for processes.

``RayWorkerStarter.start`` is the elastic driver's "start worker N on host H": it creates one actor
pinned to that Ray node (``NodeAffinitySchedulingStrategy``, not soft), hands it the worker's
environment (its id, the store's address, the job's secret) through a Ray call, and runs the training
function there. ``ActorProcess`` gives the driver the part of ``subprocess.Popen`` it uses (``poll``,
``wait``, a signal to end it), read from the actor task's Ray object reference:

* the function returned: exit code 0 (its value is kept for ``ElasticRayExecutor.run``);
* it raised: exit code 1, and its traceback goes through the worker's stderr relay (``[w3]<stderr>:``),
  so the driver's log names the worker and its last line;
* the actor died: if Ray says its node is gone, ``lost_reason`` names the node (the driver then treats the
  host as unreachable, as for a lost SSH connection); otherwise it failed (exit code 1, Ray's reason);
* the actor is *unavailable* (Ray lost its connection to it, as when its node just went down): nothing is
  decided until Ray marks the node dead (lost) or ``UNAVAILABLE_GRACE_S`` pass (failed), so that a node
  going down is one membership change, not a replacement started there first;
* the driver ended it (``send_signal``): the actor is killed, ``-signal`` as for a local process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..launch.spawn.output import OutputRelay
from ..launch.spawn.rank_env import Placement, rank_environment
from ..launch.spawn.worker import ProcessName, Worker
from ..store_auth import JobCredentials

__all__ = ["ActorProcess", "ElasticWorkerActor", "RayWorkerStarter"]

#: How long an actor Ray cannot reach may stay so before its worker counts as failed (Ray's own node
#: health checks decide sooner: 5 failed checks 3 s apart by default).
UNAVAILABLE_GRACE_S = 30.0


class ElasticWorkerActor:
    """The actor behind one elastic worker: it takes the worker's environment and runs the function."""

    def run(self, env: Mapping[str, str], fn: Callable[..., Any], args: Sequence[Any],
            kwargs: Mapping[str, Any]) -> Any:
        os.environ.update(env)
        try:
            return fn(*args, **kwargs)
        finally:
            import torchring

            torchring.shutdown()  # a no-op unless the function initialised torchring


class ActorProcess:
    """One worker's actor and its running task, with the ``Popen`` calls the elastic driver makes."""

    def __init__(self, ray: Any, actor: Any, task: Any, node_alive: Callable[[], bool], node: str) -> None:
        self._ray, self._actor, self._task = ray, actor, task
        self._node_alive, self._node = node_alive, node
        self.returncode: int | None = None
        #: The function's return value, once it returned.
        self.result: Any = None
        #: Why the actor's node is out of reach (set when the actor died with its node).
        self.lost_reason: str | None = None
        self._ended_by: int | None = None
        #: When Ray first said the actor was unavailable (None: it has not).
        self._unavailable_since: float | None = None
        self._lock = threading.Lock()
        read_out, write_out = os.pipe()
        os.close(write_out)  # the actor's own output reaches the driver through Ray's log forwarding
        read_err, self._write_err = os.pipe()  # what the driver says about the worker (its exception)
        self.stdout = os.fdopen(read_out, "rb")
        self.stderr = os.fdopen(read_err, "rb")

    @property
    def pid(self) -> None:
        """Not a process of this host (the hang detector and ``os.killpg`` do not apply)."""
        return None

    def poll(self) -> int | None:
        """The exit code once the task ended, else None (never blocks)."""
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            ready, _ = self._ray.wait([self._task], timeout=0)
            if not ready:
                return None
            code = self._outcome()
            if code is None:
                return None
            self.returncode = code
            self._finish()
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the task to end (``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"Ray actor on {self._node}", timeout or 0.0)
            pause = min(left, 1.0) if left is not None else 1.0
            if self._unavailable_since is not None:
                time.sleep(min(pause, 0.2))  # the task is "ready" with an error: ray.wait would not wait
            else:
                self._ray.wait([self._task], timeout=pause)

    def send_signal(self, signum: int) -> None:
        """SIGTERM, SIGINT or SIGKILL end the actor (Ray kills its process); SIGCONT means nothing here."""
        if signum not in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL) or self.returncode is not None:
            return
        if self._ended_by is None:
            self._ended_by = signum
            self._kill()

    def _outcome(self) -> int | None:
        """The exit code the finished task stands for; None while an unavailable actor is undecided."""
        ray = self._ray
        try:
            self.result = ray.get(self._task, timeout=0)
            return 0
        except ray.exceptions.RayTaskError as error:
            self._say(str(error))
            return 1
        except ray.exceptions.RayActorError as error:
            if self._ended_by is not None:
                return -self._ended_by
            if not self._node_alive():
                self.lost_reason = f"its Ray node {self._node} died (Ray: {type(error).__name__})"
                return 1
            if isinstance(error, ray.exceptions.ActorUnavailableError):
                now = time.monotonic()
                self._unavailable_since = self._unavailable_since or now
                if now - self._unavailable_since < UNAVAILABLE_GRACE_S:
                    return None
                self.lost_reason = (f"Ray could not reach its actor on {self._node} for {UNAVAILABLE_GRACE_S:g} s "
                                    f"(Ray: {_first_line(error)})")
                return 1
            self._say(f"its Ray actor died: {error}")
            return 1

    def _say(self, text: str) -> None:
        try:
            os.write(self._write_err, (text.rstrip() + "\n").encode(errors="replace"))
        except OSError:
            pass

    def _finish(self) -> None:
        if self._write_err >= 0:
            os.close(self._write_err)
            self._write_err = -1
        self._kill()  # its work is over: free the actor's resources

    def _kill(self) -> None:
        try:
            self._ray.kill(self._actor, no_restart=True)
        except Exception:  # noqa: BLE001 - an actor Ray already forgot is ended anyway
            pass


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0].strip()[:200] if lines else type(error).__name__


class RayWorkerStarter:
    """Starts the elastic driver's workers as Ray actors on the nodes ``RayHostDiscovery`` found."""

    def __init__(self, ray: Any, fn: Callable[..., Any], node_ids: Callable[[], Mapping[str, str]],
                 node_alive: Callable[[str], bool], store_host: str, store_port: int,
                 credentials: JobCredentials, env_vars: Mapping[str, str] | None = None, cpus_per_slot: float = 1,
                 gpus_per_slot: float = 0) -> None:
        """``node_ids()``: the node address -> Ray node id of the last discovery; ``node_alive(address)``:
        whether Ray still lists that node alive."""
        self._ray, self._fn = ray, fn
        self._node_ids, self._node_alive = node_ids, node_alive
        self._store_host, self._store_port, self._credentials = store_host, store_port, credentials
        self._env_vars = dict(env_vars or {})
        self._actor_class = ray.remote(num_cpus=cpus_per_slot, num_gpus=gpus_per_slot)(ElasticWorkerActor)

    def add_reports(self, reports: Mapping[str, Any]) -> None:
        """Ray actors need no SSH preflight."""

    def start(self, name: ProcessName, host: str, variables: Mapping[str, str], local_size: int,
              show: bool = True, slot: int = 0) -> Worker:
        """Worker ``name`` as an actor on the Ray node at ``host``, running the function."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = self._node_ids().get(host)
        if node_id is None:
            raise RuntimeError(f"no Ray node at {host} (it left the cluster)")
        env = rank_environment(self._env_vars, variables, self._store_host, self._store_port, local_size,
                               credentials=self._credentials)
        actor = self._actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote()
        task = actor.run.remote(env, self._fn, (), {})
        process = ActorProcess(self._ray, actor, task, lambda: self._node_alive(host), host)
        relays = (OutputRelay(name.label, "stdout", process.stdout, sys.stdout.buffer, show=show),
                  OutputRelay(name.label, "stderr", process.stderr, sys.stderr.buffer, show=show))
        for relay in relays:
            relay.start()
        return Worker(name, host, Placement.RAY, process, relays, probe=None, link=process,  # type: ignore[arg-type]
                      slot=slot)

