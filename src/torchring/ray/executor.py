"""``RayExecutor``: torchring ranks as Ray actors, with the API of ``horovod.ray.RayExecutor``.

``start()`` reserves one bundle per rank in a placement group, starts one actor in each, learns on which
node each landed, numbers the ranks node by node (so local ranks are contiguous, as ``torchring run``
does) and hands every actor its place, the address of a rendezvous store that this process (the Ray
driver) serves, and a fresh job secret, all through Ray's own calls, never on a command line. The
actors then call ``hvd.init()`` like any rank: ``run(fn)`` runs ``fn`` on every rank and returns the
results in rank order.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..launch.hosts import HostSlots, assign_ranks
from ..launch.rendezvous import RendezvousServer
from ..launch.spawn.rank_env import rank_environment, topology_variables

__all__ = ["RayExecutor", "RaySettings"]


@dataclass(frozen=True)
class RaySettings:
    """What ``RayExecutor.create_settings`` returns (Horovod's names; SSH is not used on Ray)."""

    timeout_s: int = 30
    placement_group_timeout_s: int = 100
    nics: Sequence[str] | None = None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("torchring.ray needs Ray: pip install 'torchring[ray]' (or pip install ray)") from None
    return ray


class _Rank:
    """The actor behind one rank: it holds the rank's environment and runs what the executor sends."""

    def __init__(self) -> None:
        self.executable: Any = None

    def where(self) -> tuple[str, str]:
        """This actor's host name and the node's IP address as Ray knows it."""
        ray = _import_ray()
        return socket.gethostname(), ray.util.get_node_ip_address()

    def join(self, env: dict[str, str], executable_cls: type | None, args: Sequence[Any],
             kwargs: dict[str, Any]) -> None:
        os.environ.update(env)
        if executable_cls is not None:
            self.executable = executable_cls(*args, **kwargs)

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.executable)

    def run(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        return fn(*args, **kwargs)


class RayExecutor:
    """Run torchring ranks on a Ray cluster: ``start()``, then ``run(fn)`` (or ``execute``), then ``shutdown()``.

    ``num_workers`` ranks (or ``num_hosts`` x ``num_workers_per_host``, spread one group per node), each
    with ``cpus_per_worker`` CPUs and, with ``use_gpu``, ``gpus_per_worker`` GPUs (default 1).
    """

    @staticmethod
    def create_settings(timeout_s: int = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                        placement_group_timeout_s: int = 100, nics: Sequence[str] | None = None) -> RaySettings:
        """Horovod's settings object; the SSH arguments are accepted and unused (Ray starts the ranks)."""
        return RaySettings(timeout_s, placement_group_timeout_s, tuple(nics) if nics else None)

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1, cpus_per_worker: int = 1,
                 use_gpu: bool = False, gpus_per_worker: int | None = None, **_ignored: Any) -> None:
        if num_workers is None and num_hosts is None:
            raise ValueError("RayExecutor: give num_workers, or num_hosts and num_workers_per_host")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("RayExecutor: give num_workers or num_hosts, not both")
        self.settings = settings or RaySettings()
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = num_workers if num_workers is not None else int(num_hosts or 0) * num_workers_per_host
        if self.num_workers < 1:
            raise ValueError(f"RayExecutor: needs at least one worker, got {self.num_workers}")
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers: list[Any] = []
        self._placement_group: Any = None
        self._server: RendezvousServer | None = None

    # ---- start and stop ------------------------------------------------------------------------------

    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None, extra_env_vars: dict[str, str] | None = None) -> None:
        """Reserve the workers' resources, start one actor per rank and give each its place and the secret."""
        ray = _import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        per_bundle = self.num_workers_per_host if self.num_hosts else 1  # num_hosts: one bundle per host
        bundle = {"CPU": self.cpus_per_worker * per_bundle,
                  **({"GPU": self.gpus_per_worker * per_bundle} if self.gpus_per_worker else {})}
        strategy = "STRICT_SPREAD" if self.num_hosts else "PACK"
        self._placement_group = placement_group([dict(bundle) for _ in range(self.num_workers // per_bundle)],
                                                strategy=strategy)
        if not self._wait(ray, self._placement_group.ready(), self.settings.placement_group_timeout_s):
            self.shutdown()
            raise TimeoutError(f"RayExecutor: Ray could not place {self.num_workers} workers of {bundle} within "
                               f"{self.settings.placement_group_timeout_s} s; check `ray status` for free resources")
        actor = ray.remote(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker)(_Rank)
        self.workers = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self._placement_group, placement_group_bundle_index=index // per_bundle)).remote()
            for index in range(self.num_workers)]
        places = ray.get([worker.where.remote() for worker in self.workers], timeout=self.settings.timeout_s)
        self.workers, places = self._in_rank_order(self.workers, places)
        self._server = RendezvousServer(bind="", port=0, timeout_s=max(self.settings.timeout_s, 300))
        store_host = ray.util.get_node_ip_address()
        hosts = list(dict.fromkeys(host for host, _ in places))
        slots = assign_ranks([HostSlots(host, sum(1 for h, _ in places if h == host)) for host in hosts],
                             self.num_workers)
        base = dict(extra_env_vars or {})
        joins = []
        for worker, slot in zip(self.workers, slots, strict=True):
            env = rank_environment(base, topology_variables(slot), store_host, self._server.port, slot.local_size,
                                   credentials=self._server.credentials)
            joins.append(worker.join.remote(env, executable_cls, list(executable_args or ()),
                                            dict(executable_kwargs or {})))
        ray.get(joins, timeout=self.settings.timeout_s)

    @staticmethod
    def _wait(ray: Any, ready: Any, timeout_s: float) -> bool:
        done, _ = ray.wait([ready], timeout=timeout_s)
        return bool(done)

    @staticmethod
    def _in_rank_order(workers: list[Any], places: list[tuple[str, str]]) -> tuple[list[Any], list[tuple[str, str]]]:
        """Workers grouped node by node, nodes in the order their first worker came, so that the ranks of
        one node are contiguous and its local ranks follow them."""
        first_seen: dict[str, int] = {}
        for index, (host, _) in enumerate(places):
            first_seen.setdefault(host, index)
        order = sorted(range(len(workers)), key=lambda index: (first_seen[places[index][0]], index))
        return [workers[index] for index in order], [places[index] for index in order]

    def shutdown(self) -> None:
        """End every actor, release the placement group and stop serving the store. Safe to call again."""
        ray = _import_ray()
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._placement_group)
            self._placement_group = None
        if self._server is not None:
            self._server.close()
            self._server = None

    # ---- running -----------------------------------------------------------------------------------

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the Ray object references, in rank order."""
        self._require_started()
        return [worker.run.remote(fn, list(args or ()), dict(kwargs or {})) for worker in self.workers]

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
            kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order (a rank's exception is raised)."""
        return _import_ray().get(self.run_remote(fn, args, kwargs))

    def execute(self, fn: Callable[[Any], Any]) -> list[Any]:
        """``fn(executable)`` on every rank (the ``executable_cls`` instance made by ``start``), in rank order."""
        self._require_started()
        return _import_ray().get([worker.execute.remote(fn) for worker in self.workers])

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""
        self._require_started()
        return _import_ray().get(self.workers[0].execute.remote(fn))

    def _require_started(self) -> None:
        if not self.workers:
            raise RuntimeError("RayExecutor: call start() first (or it was shut down)")
