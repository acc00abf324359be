"""``torchring run``: start a job's ranks on this host and on remote hosts over SSH, and supervise them
to the end.

Each rank gets the torchring/Horovod variables (``TORCHRING_RANK``, ``HOROVOD_RANK``, ...) and
torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so a Horovod
style script and a plain ``torch.distributed``/DDP script both run unchanged. The launcher serves the
rendezvous store on a free port; output lines are prefixed with the rank; the first rank to fail
ends the job, and every rank's process group is terminated, on every host.

With remote hosts, preflight runs first, on all of them in parallel: SSH, versions, and whether each
host reaches the store. No rank starts unless every check passes.

Every rank's Python stack is sampled (``hang_detector``; remote ones by their ``remote_rank``
supervisor, which also exchanges a heartbeat with the launcher): when no rank made progress for
``--hang-timeout`` seconds the job ends with a report of where every rank is, blaming the frozen or
stuck rank; SIGUSR1 to the launcher prints the same report and the job goes on.

With ``--min-np``/``--max-np``/``--host-discovery-script`` the job is elastic (``elastic_driver``). Both
kinds start their processes with the same spawner (``spawner``); a flag that cannot apply to the job's
kind is refused (``flag_modes``).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import settings
from ..contract import METRICS_PUBLISH
from ..network import address_of, route_source
from ..store_auth import AuthenticatedStore
from .elastic.discovery import HostDiscovery
from .elastic.driver import ElasticDriver
from .elastic.records import ElasticSettings
from .elastic.recovery import RecoveryClock
from .hosts import HostSlots, assign_ranks, is_local_host
from .rendezvous import ALL_INTERFACES, LOOPBACK, RendezvousServer
from .spawn.containers import ContainerOptions
from .spawn.preflight import PreflightError, require_hosts
from .spawn.rank_env import EnvironmentPlan, topology_variables
from .spawn.spawner import ProcessName, Spawner, SpawnSettings
from .spawn.ssh import SshOptions, destination_address
from .spawn.worker import Worker
from .supervisor import Failure, Supervisor, report_failure
from .watch.hang_detector import HangDetector
from .watch.stragglers import StragglerWatch

if TYPE_CHECKING:
    from ..metrics.exporter import LauncherFamilies

#: The launcher's default ``--hang-timeout`` and the variable that sets it when the flag is not given.
DEFAULT_HANG_TIMEOUT_S: float = settings.variable("HANG_TIMEOUT").default
HANG_TIMEOUT_VARIABLE = settings.variable("HANG_TIMEOUT").name
#: Where the ``--metrics-port`` page listens by default (``--metrics-address``): every interface, so that a
#: Prometheus server elsewhere can scrape it; the page only shows counters (``docs/security.md``).
DEFAULT_METRICS_ADDRESS = "0.0.0.0"

__all__ = ["PreflightError", "RunConfig", "run_elastic_job", "run_job"]


@dataclass(frozen=True)
class RunConfig:
    """What ``torchring run`` was asked to do."""

    num_proc: int
    hosts: list[HostSlots]
    command: list[str]
    port: int = 0
    ranks_to_show: frozenset[int] | None = None
    verbose: bool = False
    horovod_compat: bool = False
    #: Variables every rank gets from the tuning flags.
    tuning: dict[str, str] = field(default_factory=dict)
    ssh: SshOptions = field(default_factory=SshOptions)
    network_interfaces: tuple[str, ...] = ()
    output_dir: str | None = None
    #: ``-x NAME``: variables passed on to remote ranks; ``--env NAME=VALUE``: set for every rank.
    forward_names: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    #: Set for an elastic job (with its discovery script, if any).
    elastic: ElasticSettings | None = None
    discovery_script: str | None = None
    slots_per_host: int | None = None
    metrics_port: int | None = None
    #: ``--image``: every rank runs in a container (and its working directory inside it).
    container: ContainerOptions | None = None
    container_workdir: str = "/workspace"
    #: ``--hang-timeout``: seconds without progress on any rank before the job is declared hung (0: off).
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S
    #: ``--metrics-address``: where the ``--metrics-port`` page listens ("": every interface).
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    #: ``--prefix-output-with-timestamp``: every relayed line starts with the time.
    timestamp_output: bool = False


def _serve_metrics(config: RunConfig, store: AuthenticatedStore, max_ranks: int,
                   stragglers: StragglerWatch | None = None,
                   launcher_families: LauncherFamilies | None = None) -> dict[str, str]:
    """Serve the job's metrics when asked (with the straggler gauges of ``stragglers`` and the families
    of ``launcher_families``); the variables that make the ranks publish theirs."""
    if config.metrics_port is None:
        return {}
    from ..metrics.exporter import serve_job_metrics

    try:
        serve_job_metrics(store, config.metrics_port, max_ranks, config.metrics_address,
                          straggler_gauges=stragglers.gauges if stragglers is not None else None,
                          launcher_families=launcher_families)
    except OSError as error:
        raise OSError(f"cannot serve metrics on {config.metrics_address}:{config.metrics_port}: "
                      f"{error.strerror}; choose another --metrics-port or --metrics-address") from None
    if config.verbose:
        _log(f"metrics at http://{config.metrics_address}:{config.metrics_port}/metrics")
    return {METRICS_PUBLISH: "1"}


def store_bind_address(config: RunConfig, remote_hosts: Sequence[str] | None) -> str:
    """Where the job's store listens: loopback when every rank is on this host (``remote_hosts`` empty),
    the address of ``--network-interface`` when exactly one is given, else the address this host's routes
    use towards every remote host when that is one address; else (several, unknown: an elastic job with a
    discovery script, ``remote_hosts`` None) every interface."""
    if remote_hosts is not None and not remote_hosts:
        return LOOPBACK
    if len(config.network_interfaces) == 1:
        return address_of(config.network_interfaces[0])
    if remote_hosts is None or len(config.network_interfaces) > 1:
        return ALL_INTERFACES
    with ThreadPoolExecutor(max_workers=min(32, len(remote_hosts))) as pool:
        destinations = list(pool.map(lambda host: destination_address(host, config.ssh), remote_hosts))
    sources = {route_source(address) if address else None for address in destinations}
    source = sources.pop() if len(sources) == 1 else None
    return source if source and not source.startswith("127.") else ALL_INTERFACES


def _local_store_address(bind: str) -> str:
    """Where ranks on this host find the store: the address it listens on, or loopback."""
    return LOOPBACK if bind in (LOOPBACK, ALL_INTERFACES) else bind


def spawn_settings(config: RunConfig, extra_env: dict[str, str] | None = None,
                   stack_dir: str | None = None) -> SpawnSettings:
    """How the job's processes start (``extra_env``: variables the launcher adds for every one;
    ``stack_dir``: where local processes write stack dumps for the hang detector)."""
    plan = EnvironmentPlan({**os.environ, **config.tuning}, config.forward_names,
                           {**config.extra_env, **(extra_env or {})}, config.network_interfaces)
    return SpawnSettings(config.command, plan, config.ssh, config.horovod_compat, config.container,
                         config.container_workdir, config.output_dir, config.verbose, stack_dir,
                         timestamp_output=config.timestamp_output)


def _log(message: str) -> None:
    print(f"torchring run: {message}", file=sys.stderr, flush=True)


class JobScaffold:
    """What every job needs, fixed or elastic: the store server (which made the job's id and secret), the
    directory of the stack dumps, the ``--metrics-port`` page and the spawner. ``close()`` releases them
    all (after the job's processes ended); a failure while setting up releases what was set up.

    ``remote_hosts``: the remote hosts the job uses (None: not known in advance, a discovery script);
    ``max_ranks``: the most ranks the metrics page shows; ``with_store`` is called with the signed store
    before anything starts."""

    def __init__(self, config: RunConfig, remote_hosts: Sequence[str] | None, max_ranks: int,
                 stragglers: StragglerWatch | None = None, launcher_families: LauncherFamilies | None = None,
                 with_store: Callable[[AuthenticatedStore], None] | None = None) -> None:
        self.server = RendezvousServer(store_bind_address(config, remote_hosts), config.port)
        self.stack_dir = tempfile.mkdtemp(prefix="torchring-stack-dumps-")
        self.spawner: Spawner | None = None
        try:
            if with_store is not None:
                with_store(self.server.auth)
            metrics_env = _serve_metrics(config, self.server.auth, max_ranks, stragglers, launcher_families)
            self.spawner = Spawner(spawn_settings(config, metrics_env, self.stack_dir), self.server.port,
                                   self.server.credentials, log=_log,
                                   local_store_address=_local_store_address(self.server.bind))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the spawner's links and the store, and remove the stack dumps."""
        if self.spawner is not None:
            self.spawner.close()
        self.server.close()
        shutil.rmtree(self.stack_dir, ignore_errors=True)


def run_job(config: RunConfig, with_store: Callable[[AuthenticatedStore], None] | None = None,
            after_job: Callable[[AuthenticatedStore], None] | None = None,
            on_failure: Callable[[Failure, Sequence[Worker]], None] | None = None) -> int:
    """Start every rank, relay output, and return the job's exit code. ``with_store`` is called with the
    job's (signed) store before any rank starts, ``after_job`` once all have ended (``torchring.run``
    passes a function and collects results through them), ``on_failure`` with the failure the summary
    reports and every rank's record when the job failed."""
    assignments = assign_ranks(config.hosts, config.num_proc)
    remote_hosts = list(dict.fromkeys(slot.hostname for slot in assignments if not is_local_host(slot.hostname)))
    stragglers = StragglerWatch(_log)
    stragglers.expect(range(config.num_proc))
    job = JobScaffold(config, remote_hosts, config.num_proc, stragglers=stragglers, with_store=with_store)
    server, spawner = job.server, job.spawner
    assert spawner is not None
    try:
        if remote_hosts:
            spawner.add_reports(require_hosts(remote_hosts, server.port, config.network_interfaces, config.ssh,
                                              _log if config.verbose else None))
    except BaseException:
        job.close()
        raise
    if config.verbose:
        where = f"on {len({s.hostname for s in assignments})} host(s)" if remote_hosts else "on this host"
        _log(f"{config.num_proc} ranks {where}, rendezvous port {server.port}")
    detector = HangDetector(config.hang_timeout_s, _log, lambda: supervisor.wake(), stragglers=stragglers)
    supervisor = Supervisor(peer_failure=server.peer_failure, detector=detector if config.hang_timeout_s else None,
                            own_failure=server.own_failure, deadlock=server.deadlock)
    spawner.links.on_lost = lambda _link: supervisor.wake()
    previous = {sig: signal.signal(sig, lambda signum, _frame: supervisor.request_stop(signum))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda _signum, _frame: detector.request_report())
    try:
        for slot in assignments:
            show = config.ranks_to_show is None or slot.rank in config.ranks_to_show
            worker = spawner.start(ProcessName("rank", slot.rank), slot.hostname, topology_variables(slot),
                                   slot.local_size, show=show, slot=slot.local_rank)
            supervisor.add(worker)
            detector.add(slot.rank, worker.process, worker.probe)
        detector.start()
        failure = supervisor.wait()
        if after_job is not None:
            after_job(server.auth)
    except BaseException:
        supervisor.terminate_all()
        raise
    finally:
        detector.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        job.close()
    if failure is None:
        return 0
    report_failure(failure, supervisor.workers)
    if on_failure is not None:
        on_failure(failure, supervisor.workers)
    return failure.exit_code


def run_elastic_job(config: RunConfig) -> int:
    """Run an elastic job with ``ElasticDriver``."""
    driver, job = build_elastic_driver(config)
    try:
        return driver.run()
    finally:
        job.close()


def build_elastic_driver(config: RunConfig) -> tuple[ElasticDriver, JobScaffold]:
    """The driver of an elastic job and its scaffold (its store serving, its metrics page up when asked),
    which the caller closes after ``driver.run()`` or ``driver.close()``."""
    assert config.elastic is not None
    if config.discovery_script:
        discovery = HostDiscovery(script=config.discovery_script, slots_per_host=config.slots_per_host)
    else:
        discovery = HostDiscovery(fixed=config.hosts, slots_per_host=config.slots_per_host)
    remote = None if config.discovery_script else [h.hostname for h in config.hosts if not is_local_host(h.hostname)]
    recovery = RecoveryClock()
    job = JobScaffold(config, remote, min(config.elastic.max_np + config.elastic.spares, 4096),
                      launcher_families=recovery.families)
    assert job.spawner is not None
    detector = HangDetector(config.hang_timeout_s, _log, lambda: None, noun="worker")
    driver = ElasticDriver(config.elastic, discovery, job.spawner, job.server, config.ssh, config.network_interfaces,
                           ranks_to_show=config.ranks_to_show, verbose=config.verbose, log=_log, detector=detector,
                           recovery=recovery)
    return driver, job
