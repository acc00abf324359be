"""The flags of ``torchring run`` (Horovod's names) and their validation into a ``RunConfig``.

Errors are ``HostSpecError`` (a bad host list) or ``ValueError`` with a message naming the flag; the
command line (``run_command``) prints them as usage errors.
"""

from __future__ import annotations

import argparse
import os
import sys

from ... import settings
from ..elastic.records import ElasticSettings
from ..hosts import HostSlots, is_local_host, parse_hostfile, parse_hosts, slurm_allocation
from ..job import DEFAULT_HANG_TIMEOUT_S, DEFAULT_METRICS_ADDRESS, HANG_TIMEOUT_VARIABLE, RunConfig
from ..spawn.containers import ContainerOptions
from ..spawn.ssh import SshOptions
from .command_checks import check_command, misplaced_flags
from .flag_modes import check_flags_for_mode
from .horovod_flags import add_horovod_flags, horovod_flag_effects
from .tuning import add_tuning_arguments, tuning_environment

__all__ = ["add_run_arguments", "config_from_args"]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``torchring run`` (horovodrun's names)."""
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int,
                        help="number of ranks to start (required, here or in --config-file, except inside a Slurm "
                             "allocation: its tasks)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", help="hosts and slots, e.g. localhost:4")
    hosts.add_argument("-hostfile", "--hostfile", dest="hostfile", help="file with one 'host slots=N' per line")
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
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int,
                         help="fewest workers the job runs with (default: -np)")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int,
                         help="most workers the job grows to (default: -np, or no limit)")
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
    parser.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                        help="show which frameworks, controllers and tensor operations are available, and exit")
    add_tuning_arguments(parser)
    add_horovod_flags(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


_PROG = "torchring run"


def _say(message: str) -> None:
    print(f"{_PROG}: {message}", file=sys.stderr, flush=True)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Validate parsed flags into a ``RunConfig``; errors are ``HostSpecError``/``ValueError``."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    elastic = _elastic_settings(args)
    check_flags_for_mode(args, elastic is not None)
    allocation = None
    if not (args.hostfile or args.hosts or args.host_discovery_script) and elastic is None:
        allocation = slurm_allocation(os.environ)
    num_proc = args.num_proc
    if num_proc is None and elastic is None:
        if allocation is None:
            misplaced = misplaced_flags(command)
            if misplaced:
                raise ValueError(f"-np is required; {' '.join(misplaced)} came after the command, where it is the "
                                 f"program's own argument: the launcher's options go first, as in "
                                 f"{_PROG} -np 2 python train.py")
            raise ValueError("-np is required (on the command line or in --config-file)")
        num_proc = sum(host.slots for host in allocation.hosts)
    if not command:
        raise ValueError(f"no command given; usage: {_PROG} -np 2 python train.py")
    transport = "ssh"
    if args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    elif args.hosts:
        hosts = parse_hosts(args.hosts)
    elif args.host_discovery_script:
        hosts = []
    elif allocation is not None:
        hosts, transport = allocation.hosts, "srun"
        _say(f"{allocation.describe()}; ranks on other nodes start with srun")
    else:
        hosts = [HostSlots("localhost", max(num_proc or (elastic.max_np if elastic else 1), 1)
                           + (elastic.spares if elastic else 0))]
        if elastic is not None:
            _say(f"no -H, --hostfile or --host-discovery-script: this host has {hosts[0].slots} worker slots "
                 f"(--max-np {elastic.max_np}{f' + --spares {elastic.spares}' if elastic.spares else ''}), "
                 f"whatever its {os.cpu_count()} cores")
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
                     python=args.python or sys.executable, transport=transport)
    container = _container_options(args)
    local = container is None and not args.host_discovery_script and all(is_local_host(h.hostname) for h in hosts)
    command = check_command(command, f"{_PROG} -np {num_proc or 2}", local, _say)  # after every flag's check
    return RunConfig(
        num_proc=num_proc or (elastic.min_np if elastic else 0), hosts=hosts, command=command, port=args.port,
        ranks_to_show=ranks_to_show, verbose=args.verbose, horovod_compat=args.horovod_compat,
        tuning={**tuning_environment(args), **horovod_flag_effects(args, _say)}, ssh=ssh,
        timestamp_output=args.prefix_output_with_timestamp, network_interfaces=tuple(args.network_interface),
        output_dir=args.output_filename, forward_names=tuple(args.forward), extra_env=extra_env, elastic=elastic,
        discovery_script=args.host_discovery_script, slots_per_host=args.slots_per_host,
        metrics_port=_metrics_port(args.metrics_port), container=container,
        container_workdir=args.image_workdir or "/workspace", hang_timeout_s=_hang_timeout(args.hang_timeout),
        metrics_address=_metrics_address(args.metrics_address))


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


def _metrics_address(address: str | None) -> str:
    return (address or DEFAULT_METRICS_ADDRESS).strip()


def _hang_timeout(value: float | None) -> float:
    """``--hang-timeout``, else ``TORCHRING_HANG_TIMEOUT`` (the settings table), else the default."""
    if value is None:
        return settings.read("HANG_TIMEOUT")
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
