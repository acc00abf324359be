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

import argparse
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..contract import METRICS_PUBLISH
from ..store_auth import AuthenticatedStore
from .containers import ContainerOptions
from .discovery import HostDiscovery
from .elastic_driver import ElasticDriver
from .elastic_recovery import RecoveryClock
from .elastic_worker import ElasticSettings
from .flag_modes import check_flags_for_mode
from .hang_detector import HangDetector
from .hosts import HostSlots, assign_ranks, is_local_host, parse_hostfile, parse_hosts
from .network import address_of, route_source
from .preflight import PreflightError, require_hosts
from .rendezvous import ALL_INTERFACES, LOOPBACK, RendezvousServer
from .spawner import ProcessName, Spawner, SpawnSettings
from .ssh import SshOptions, destination_address
from .stragglers import StragglerWatch
from .supervisor import Supervisor, Worker, report_failure
from .tuning import add_tuning_arguments, tuning_environment
from .worker_env import EnvironmentPlan, topology_variables

if TYPE_CHECKING:
    from ..metrics.exporter import LauncherFamilies

#: The launcher's default ``--hang-timeout`` and the variable that sets it when the flag is not given.
DEFAULT_HANG_TIMEOUT_S = 300.0
HANG_TIMEOUT_VARIABLE = "TORCHRING_HANG_TIMEOUT"
#: Where the ``--metrics-port`` page listens by default (``--metrics-address``): every interface, so that a
#: Prometheus server elsewhere can scrape it; the page only shows counters (``docs/security.md``).
DEFAULT_METRICS_ADDRESS = "0.0.0.0"

__all__ = ["PreflightError", "RunConfig", "add_run_arguments", "config_from_args", "run_elastic_job", "run_job"]


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


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``torchring run`` (horovodrun's names)."""
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int,
                        help="number of ranks to start (required, here or in --config-file)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", help="hosts and slots, e.g. localhost:4")
    hosts.add_argument("--hostfile", dest="hostfile", help="file with one 'host slots=N' per line")
    parser.add_argument("--port", type=int, default=0,
                        help="port of the rendezvous store (MASTER_PORT); default: a free port")
    parser.add_argument("--ranks", default=None,
                        help="show console output of these ranks only, e.g. 0 or 0,3")
    parser.add_argument("--verbose", action="store_true", help="describe the launch")
    parser.add_argument("--horovod-compat", action="store_true",
                        help="let unchanged scripts 'import horovod.torch as hvd' and get torchring")
    remote = parser.add_argument_group("remote hosts")
    remote.add_argument("-p", "--ssh-port", type=int, help="SSH port of the remote hosts")
    remote.add_argument("-i", "--ssh-identity-file", help="SSH private key for the remote hosts")
    remote.add_argument("--start-timeout", type=float, default=30.0,
                        help="seconds preflight may take on each host (default 30)")
    remote.add_argument("--network-interface", action="append", default=[],
                        help="interface the hosts talk over (repeatable); default: the one SSH uses")
    remote.add_argument("--python", help="Python interpreter on the remote hosts (default: this one's path)")
    remote.add_argument("-x", dest="forward", action="append", default=[], metavar="NAME",
                        help="also pass this environment variable on to remote ranks (repeatable)")
    remote.add_argument("--env", dest="extra_env", action="append", default=[], metavar="NAME=VALUE",
                        help="set this variable for every rank (repeatable)")
    elastic = parser.add_argument_group("elastic training (any of --min-np, --max-np, --host-discovery-script)")
    elastic.add_argument("--min-np", type=int, help="fewest workers the job runs with (default: -np)")
    elastic.add_argument("--max-np", type=int, help="most workers the job grows to (default: -np, or no limit)")
    elastic.add_argument("--slots-per-host", type=int,
                         help="slots of each host the discovery script lists without a slot count (default 1)")
    elastic.add_argument("--host-discovery-script", help="program printing the usable hosts, one host[:slots] a line")
    elastic.add_argument("--reset-limit", type=int, help="most membership changes (resets) the job may go through")
    elastic.add_argument("--blacklist-cooldown-range", type=float, nargs=2, metavar=("MIN", "MAX"),
                         help="a host where a worker failed is left out for a random MIN..MAX seconds (default: "
                              "for good)")
    elastic.add_argument("--elastic-timeout", type=float,
                         help="seconds to wait for enough hosts before giving up (default 600)")
    elastic.add_argument("--spares", type=int, metavar="K",
                         help="keep K hot spares started (torch imported, waiting in hvd.init()) on slots beyond "
                              "--max-np, so that a lost worker is replaced without a cold start (default 0)")
    parser.add_argument("--output-filename", help="also write each rank's output to DIR/rank.N/stdout and stderr")
    containers = parser.add_argument_group("containers (each rank in `docker run` on its host)")
    containers.add_argument("--image", help="run every rank in a container of this image (--ipc=host, "
                                            "--network host, memlock unlimited; --gpus all on hosts with NVIDIA GPUs)")
    containers.add_argument("--image-shm-size", help="give containers this /dev/shm size instead of --ipc=host")
    containers.add_argument("--image-volume", action="append", default=[], metavar="SRC:DST",
                            help="mount this volume in every container (repeatable)")
    containers.add_argument("--image-workdir",
                            help="working directory inside the containers (default /workspace)")
    containers.add_argument("--image-no-gpus", action="store_true",
                            help="never pass --gpus all (by default it is passed on hosts with NVIDIA GPUs)")
    parser.add_argument("--config-file", help="YAML file with values for these flags (flags given here win)")
    parser.add_argument("--metrics-port", type=int,
                        help="serve every rank's Prometheus metrics and job totals on this port of this host")
    parser.add_argument("--metrics-address", default=DEFAULT_METRICS_ADDRESS,
                        help="address the --metrics-port page listens on (default 0.0.0.0, every interface; "
                             "127.0.0.1 for this host only)")
    parser.add_argument("--hang-timeout", type=float, metavar="SECONDS",
                        help="end the job, naming the frozen or stuck rank(s) and showing every rank's stack, when "
                             f"no rank's Python stack changed for this long (default "
                             f"{DEFAULT_HANG_TIMEOUT_S:g}, or ${HANG_TIMEOUT_VARIABLE}; 0: off). SIGUSR1 to the "
                             "launcher prints every rank's stack at any time")
    parser.add_argument("--check-build", action="store_true",
                        help="show which frameworks, controllers and tensor operations are available, and exit")
    add_tuning_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Validate parsed flags into a ``RunConfig``; errors are ``HostSpecError``/``ValueError``."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    elastic = _elastic_settings(args)
    check_flags_for_mode(args, elastic is not None)
    if args.num_proc is None and elastic is None:
        raise ValueError("-np is required (on the command line or in --config-file)")
    if not command:
        raise ValueError("no command given; usage: torchring run -np 2 python train.py")
    if args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    elif args.hosts:
        hosts = parse_hosts(args.hosts)
    elif args.host_discovery_script:
        hosts = []
    else:
        hosts = [HostSlots("localhost", max(args.num_proc or (elastic.max_np if elastic else 1), 1)
                           + (elastic.spares if elastic else 0))]
    ranks_to_show = None
    if args.ranks is not None:
        try:
            ranks_to_show = frozenset(int(r) for r in args.ranks.split(",") if r.strip())
        except ValueError:
            raise ValueError(f"--ranks {args.ranks!r}: expected rank numbers separated by commas") from None
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port {args.port} is not a valid port")
    extra_env = {}
    for pair in args.extra_env:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--env {pair!r}: expected NAME=VALUE")
        extra_env[name] = value
    if args.start_timeout <= 0:
        raise ValueError(f"--start-timeout {args.start_timeout}: must be positive")
    ssh = SshOptions(port=args.ssh_port, identity_file=args.ssh_identity_file, connect_timeout_s=args.start_timeout,
                     python=args.python or sys.executable)
    return RunConfig(args.num_proc or (elastic.min_np if elastic else 0), hosts, command, args.port, ranks_to_show,
                     args.verbose, args.horovod_compat, tuning_environment(args), ssh, tuple(args.network_interface),
                     args.output_filename, tuple(args.forward), extra_env, elastic, args.host_discovery_script,
                     args.slots_per_host, _metrics_port(args.metrics_port), _container_options(args),
                     args.image_workdir or "/workspace", _hang_timeout(args.hang_timeout),
                     _metrics_address(args.metrics_address))


def _container_options(args: argparse.Namespace) -> ContainerOptions | None:
    if not args.image:
        if args.image_shm_size or args.image_volume or args.image_no_gpus or args.image_workdir:
            raise ValueError("--image-shm-size, --image-volume, --image-workdir and --image-no-gpus need --image")
        return None
    if args.image_workdir and not args.image_workdir.startswith("/"):
        raise ValueError(f"--image-workdir {args.image_workdir!r} must be an absolute path inside the container")
    return ContainerOptions(image=args.image, gpus=False if args.image_no_gpus else None, shm_size=args.image_shm_size,
                            volumes=tuple(args.image_volume))


def _metrics_port(port: int | None) -> int | None:
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"--metrics-port {port} is not a valid port")
    return port


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


def _metrics_address(address: str | None) -> str:
    return (address or DEFAULT_METRICS_ADDRESS).strip()


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


def _hang_timeout(value: float | None) -> float:
    """``--hang-timeout``, else ``TORCHRING_HANG_TIMEOUT``, else the default."""
    if value is None:
        text = os.environ.get(HANG_TIMEOUT_VARIABLE, "").strip()
        try:
            value = float(text) if text else DEFAULT_HANG_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{HANG_TIMEOUT_VARIABLE}={text!r}: expected seconds (0 turns the hang detector "
                             "off)") from None
    if value < 0:
        raise ValueError(f"--hang-timeout {value:g}: must be >= 0 (0 turns the hang detector off)")
    return value


#: Any of these flags makes a job elastic.
_ELASTIC_FLAGS = ("min_np", "max_np", "host_discovery_script")


def _elastic_settings(args: argparse.Namespace) -> ElasticSettings | None:
    if all(getattr(args, name) is None for name in _ELASTIC_FLAGS):
        return None
    if args.host_discovery_script and (args.hosts or args.hostfile):
        raise ValueError("--host-discovery-script and -H/--hostfile exclude each other")
    min_np = args.min_np or args.num_proc
    if min_np is None or min_np < 1:
        raise ValueError("an elastic job needs --min-np or -np (at least 1)")
    max_np = args.max_np or (args.num_proc if args.num_proc and args.num_proc >= min_np else 1 << 30)
    if max_np < min_np:
        raise ValueError(f"--max-np {max_np} is smaller than --min-np {min_np}")
    if args.num_proc is not None and not min_np <= args.num_proc <= max_np:
        raise ValueError(f"-np {args.num_proc} must lie between --min-np {min_np} and --max-np {max_np}")
    cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
    if cooldown is not None and not 0 <= cooldown[0] <= cooldown[1]:
        raise ValueError("--blacklist-cooldown-range MIN MAX needs 0 <= MIN <= MAX")
    timeout = 600.0 if args.elastic_timeout is None else args.elastic_timeout
    if timeout <= 0:
        raise ValueError("--elastic-timeout must be positive")
    if args.reset_limit is not None and args.reset_limit < 0:
        raise ValueError("--reset-limit must be >= 0")
    if args.slots_per_host is not None and args.slots_per_host < 1:
        raise ValueError("--slots-per-host must be at least 1")
    if args.spares is not None and args.spares < 0:
        raise ValueError(f"--spares {args.spares}: must be >= 0")
    if args.spares and max_np >= 1 << 30:
        raise ValueError("--spares needs --max-np (or -np): spares stand by on the slots beyond --max-np, and "
                         "without a limit every slot takes a training worker")
    return ElasticSettings(min_np=min_np, max_np=max_np, reset_limit=args.reset_limit, elastic_timeout_s=timeout,
                           cooldown_range_s=cooldown, initial_np=args.num_proc, spares=args.spares or 0)


def spawn_settings(config: RunConfig, extra_env: dict[str, str] | None = None,
                   stack_dir: str | None = None) -> SpawnSettings:
    """How the job's processes start (``extra_env``: variables the launcher adds for every one;
    ``stack_dir``: where local processes write stack dumps for the hang detector)."""
    plan = EnvironmentPlan({**os.environ, **config.tuning}, config.forward_names,
                           {**config.extra_env, **(extra_env or {})}, config.network_interfaces)
    return SpawnSettings(config.command, plan, config.ssh, config.horovod_compat, config.container,
                         config.container_workdir, config.output_dir, config.verbose, stack_dir)


def _log(message: str) -> None:
    print(f"torchring run: {message}", file=sys.stderr, flush=True)


def run_job(config: RunConfig, with_store: Callable[[AuthenticatedStore], None] | None = None,
            after_job: Callable[[AuthenticatedStore], None] | None = None) -> int:
    """Start every rank, relay output, and return the job's exit code. ``with_store`` is called with the
    job's (signed) store before any rank starts, ``after_job`` once all have ended (``torchring.run``
    passes a function and collects results through them)."""
    assignments = assign_ranks(config.hosts, config.num_proc)
    remote_hosts = list(dict.fromkeys(slot.hostname for slot in assignments if not is_local_host(slot.hostname)))
    server = RendezvousServer(store_bind_address(config, remote_hosts), config.port)
    stack_dir = tempfile.mkdtemp(prefix="torchring-stack-dumps-")
    stragglers = StragglerWatch(_log)
    try:
        if with_store is not None:
            with_store(server.auth)
        metrics_env = _serve_metrics(config, server.auth, config.num_proc, stragglers)
        spawner = Spawner(spawn_settings(config, metrics_env, stack_dir), server.port, server.credentials, log=_log,
                          local_store_address=_local_store_address(server.bind))
        if remote_hosts:
            spawner.add_reports(require_hosts(remote_hosts, server.port, config.network_interfaces, config.ssh,
                                              _log if config.verbose else None))
    except BaseException:
        server.close()
        shutil.rmtree(stack_dir, ignore_errors=True)
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
            spawned = spawner.start(ProcessName("rank", slot.rank), slot.hostname, topology_variables(slot),
                                    slot.local_size, show=show)
            supervisor.add(Worker(slot.rank, slot.hostname, spawned.process, spawned.relays, remote=spawned.remote,
                                  link=spawned.link))
            detector.add(slot.rank, spawned.process, spawned.probe)
        detector.start()
        failure = supervisor.wait()
        if after_job is not None:
            after_job(server.auth)
    except BaseException:
        supervisor.terminate_all()
        raise
    finally:
        detector.stop()
        spawner.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.close()
        shutil.rmtree(stack_dir, ignore_errors=True)
    if failure is None:
        return 0
    report_failure(failure, supervisor.workers)
    return failure.exit_code


def run_elastic_job(config: RunConfig) -> int:
    """Run an elastic job with ``ElasticDriver``."""
    driver, stack_dir = build_elastic_driver(config)
    try:
        return driver.run()
    finally:
        shutil.rmtree(stack_dir, ignore_errors=True)


def build_elastic_driver(config: RunConfig) -> tuple[ElasticDriver, str]:
    """The driver of an elastic job (its store serving, its metrics page up when asked) and the directory of
    its stack dumps, which the caller removes after ``driver.run()`` or ``driver.close()``."""
    assert config.elastic is not None
    if config.discovery_script:
        discovery = HostDiscovery(script=config.discovery_script, slots_per_host=config.slots_per_host)
    else:
        discovery = HostDiscovery(fixed=config.hosts, slots_per_host=config.slots_per_host)
    remote = None if config.discovery_script else [h.hostname for h in config.hosts if not is_local_host(h.hostname)]
    server = RendezvousServer(store_bind_address(config, remote), config.port)
    stack_dir = tempfile.mkdtemp(prefix="torchring-stack-dumps-")
    recovery = RecoveryClock()
    try:
        metrics_env = _serve_metrics(config, server.auth, min(config.elastic.max_np + config.elastic.spares, 4096),
                                     launcher_families=recovery.families)
        spawner = Spawner(spawn_settings(config, metrics_env, stack_dir), server.port, server.credentials, log=_log,
                          local_store_address=_local_store_address(server.bind))
    except BaseException:
        server.close()
        shutil.rmtree(stack_dir, ignore_errors=True)
        raise
    detector = HangDetector(config.hang_timeout_s, _log, lambda: None, noun="worker")
    driver = ElasticDriver(config.elastic, discovery, spawner, server, config.ssh, config.network_interfaces,
                           ranks_to_show=config.ranks_to_show, verbose=config.verbose, log=_log, detector=detector,
                           recovery=recovery)
    return driver, stack_dir
