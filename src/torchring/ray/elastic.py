"""``ElasticRayExecutor``: an elastic torchring job whose workers are Ray actors, with the API of
``horovod.ray.ElasticRayExecutor``.

It is ``torchring run``'s elastic driver (``launch.elastic.driver.ElasticDriver``: generations in the
store, blacklisting, ``--reset-limit``, waiting below the minimum, the recovery clock) with two parts
swapped: the hosts are the Ray nodes alive (``RayHostDiscovery``: a node's slots are its CPUs, or GPUs,
divided by what one worker needs), and a worker is an actor pinned to its node
(``actor_workers.RayWorkerStarter``). When a node dies, Ray reports its actors dead and stops listing it;
the driver names the node, takes its workers out, and the survivors roll back to their last commit and
go on (``hvd.elastic.run``). When a node joins, workers start there and the job grows at the next
``commit()``. The rendezvous store is served by this process, the Ray driver, with a fresh job secret
that reaches the actors through Ray calls only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..launch.elastic.driver import ElasticDriver
from ..launch.elastic.records import ElasticSettings
from ..launch.rendezvous import RendezvousServer
from ..launch.spawn.ssh import SshOptions
from .actor_workers import ActorProcess, RayWorkerStarter
from .executor import _import_ray

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayHostDiscovery"]

#: ``max_num_proc`` when none is given: as many workers as the nodes have slots.
UNBOUNDED = 1 << 30


@dataclass
class ElasticRaySettings:
    """What ``ElasticRayExecutor.create_settings`` returns (Horovod's names)."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600.0
    timeout_s: float = 30.0
    nics: Any = None
    verbose: bool = False
    #: Used with ``override_discovery=False``: any object with ``find_available_hosts_and_slots()``
    #: (Horovod's ``HostDiscovery``), asked about every second.
    discovery: Any = None
    #: Seconds between two looks at the Ray nodes.
    discovery_interval_s: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)


class RayHostDiscovery:
    """The Ray nodes alive, by address, each with ``CPU // cpus_per_slot`` slots (with ``use_gpu``, at most
    ``GPU // gpus_per_slot``); nodes without a slot are left out."""

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: float = 1) -> None:
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = use_gpu, cpus_per_slot, gpus_per_slot
        self.last_error = ""
        #: Node address -> Ray node id, from the last look (where the starter pins actors).
        self.node_ids: dict[str, str] = {}
        self._last: dict[str, int] = {}

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """Horovod's name for :meth:`find`."""
        return self.find()

    def find(self) -> dict[str, int]:
        ray = _import_ray()
        try:
            nodes = [node for node in ray.nodes() if node.get("Alive")]
        except Exception as error:  # noqa: BLE001 - the GCS briefly unreachable: keep the last answer
            self.last_error = f"Ray's node table could not be read ({error})"
            return dict(self._last)
        found: dict[str, int] = {}
        node_ids: dict[str, str] = {}
        for node in sorted(nodes, key=lambda node: node["NodeManagerAddress"]):
            resources = node.get("Resources", {})
            slots = int(resources.get("CPU", 0) // self.cpus_per_slot) if self.cpus_per_slot else UNBOUNDED
            if self.use_gpu:
                slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_slot))
            if slots > 0:
                found[node["NodeManagerAddress"]] = slots
                node_ids[node["NodeManagerAddress"]] = node["NodeID"]
        self.last_error = ""
        self._last, self.node_ids = found, node_ids
        return dict(found)

    def alive(self, address: str) -> bool:
        """Whether Ray lists the node at ``address`` alive now (a failed look counts as alive)."""
        try:
            return any(node.get("Alive") and node["NodeManagerAddress"] == address for node in _import_ray().nodes())
        except Exception:  # noqa: BLE001
            return True


class _HorovodDiscovery:
    """A user's Horovod-style discovery object (``find_available_hosts_and_slots()``) as the driver's."""

    def __init__(self, discovery: Any, ray_nodes: RayHostDiscovery) -> None:
        self._discovery, self._ray_nodes = discovery, ray_nodes
        self.last_error = ""
        self._last: dict[str, int] = {}

    def find(self) -> dict[str, int]:
        self._ray_nodes.find()  # where each address's node is, for pinning the actors
        try:
            self._last = {str(host): int(slots) for host, slots in
                          self._discovery.find_available_hosts_and_slots().items()}
            self.last_error = ""
        except Exception as error:  # noqa: BLE001 - the user's discovery failed: keep its last answer
            self.last_error = f"the discovery object raised {type(error).__name__}: {error}"
        return dict(self._last)


class ElasticRayExecutor:
    """Run an elastic training function on every slot of a Ray cluster, surviving nodes that come and go.

    ``create_settings(min_num_proc, max_num_proc, reset_limit, elastic_timeout)``, then ``start()``, then
    ``run(train_fn)``: ``train_fn`` runs on one actor per slot (``cpus_per_slot`` CPUs, with ``use_gpu``
    ``gpus_per_slot`` GPUs) and wraps its loop in ``hvd.elastic.run``. ``run`` returns the values of the
    workers that completed, in their final rank order, or raises ``RuntimeError`` when the job failed.
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None, reset_limit: int | None = None,
                        elastic_timeout: float = 600, timeout_s: float = 30, ssh_identity_file: str | None = None,
                        nics: Any = None, min_np: int | None = None, max_np: int | None = None,
                        verbose: bool = False, **kwargs: Any) -> ElasticRaySettings:
        """Horovod's settings; ``min_np``/``max_np`` are the older names; SSH is not used (Ray starts the
        workers)."""
        return ElasticRaySettings(min_np if min_np is not None else min_num_proc,
                                  max_np if max_np is not None else max_num_proc, reset_limit, float(elastic_timeout),
                                  float(timeout_s), nics, bool(verbose), extra=dict(kwargs))

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: float | None = None, env_vars: Mapping[str, str] | None = None,
                 override_discovery: bool = True) -> None:
        if gpus_per_slot and not use_gpu:
            raise ValueError("ElasticRayExecutor: gpus_per_slot is set but use_gpu is False")
        if settings.min_num_proc < 1:
            raise ValueError(f"ElasticRayExecutor: min_num_proc must be at least 1, got {settings.min_num_proc}")
        if settings.max_num_proc is not None and settings.max_num_proc < settings.min_num_proc:
            raise ValueError(f"ElasticRayExecutor: max_num_proc {settings.max_num_proc} is below min_num_proc "
                             f"{settings.min_num_proc}")
        if not override_discovery and settings.discovery is None:
            raise ValueError("ElasticRayExecutor: override_discovery=False needs settings.discovery")
        self.settings = settings
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        self.env_vars = dict(env_vars or {})
        self.override_discovery = override_discovery
        self._started = False
        #: The driver of the last ``run``: its resets and membership changes.
        self.driver: ElasticDriver | None = None

    def start(self) -> None:
        """Check that this process is a Ray driver (``ray.init()`` was called, or is called here)."""
        ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address="auto")
        self._started = True

    def run(self, worker_fn: Callable[[], Any], callbacks: list[Callable[[Any], None]] | None = None) -> list[Any]:
        """Run ``worker_fn()`` on every slot until training ends; the completed workers' values, in rank order."""
        if not self._started:
            raise RuntimeError("ElasticRayExecutor: call start() first")
        if callbacks:
            raise NotImplementedError("ElasticRayExecutor.run: callbacks are not supported; return values from "
                                      "worker_fn, or log from rank 0 yourself")
        ray = _import_ray()
        settings = self.settings
        ray_nodes = RayHostDiscovery(self.use_gpu, self.cpus_per_slot, self.gpus_per_slot or 1)
        discovery = ray_nodes if self.override_discovery else _HorovodDiscovery(settings.discovery, ray_nodes)
        server = RendezvousServer(bind="", port=0, timeout_s=max(settings.timeout_s, settings.elastic_timeout, 300))
        starter = RayWorkerStarter(ray, worker_fn, lambda: ray_nodes.node_ids, ray_nodes.alive,
                                   ray.util.get_node_ip_address(), server.port, server.credentials, self.env_vars,
                                   self.cpus_per_slot, self.gpus_per_slot)
        elastic = ElasticSettings(settings.min_num_proc, settings.max_num_proc or UNBOUNDED, settings.reset_limit,
                                  settings.elastic_timeout, discovery_interval_s=settings.discovery_interval_s)
        self.driver = driver = ElasticDriver(elastic, discovery, starter, server, SshOptions(),
                                             verbose=settings.verbose, log=_log, preflight=lambda _host: [])
        try:
            code = driver.run()
        finally:
            server.close()
        if code != 0:
            raise RuntimeError(f"ElasticRayExecutor: the elastic job failed (exit code {code}); the log above says "
                               "which worker or node and why")
        finished = [worker for worker in driver.workers if worker.returncode == 0 and worker.ranks]
        finished.sort(key=lambda worker: (-max(worker.ranks), worker.ranks[max(worker.ranks)]))
        return [worker.process.result for worker in finished if isinstance(worker.process, ActorProcess)]

    def shutdown(self) -> None:
        """Nothing stays running between ``run`` calls; kept for Horovod's API."""
        self._started = False


def _log(message: str) -> None:
    print(f"torchring ray: {message}", file=sys.stderr, flush=True)
