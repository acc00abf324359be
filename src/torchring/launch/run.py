"""``torchring run``: start a job's ranks on this host and supervise them to the end.

Each rank gets the torchring/Horovod variables (``TORCHRING_RANK``, ``HOROVOD_RANK``, ...) and
torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so a Horovod
style script and a plain ``torch.distributed``/DDP script both run unchanged. The launcher serves the
rendezvous store on a free port; output lines are prefixed with the rank; the first rank to fail
ends the job, and every rank's process group is terminated.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass, field

from ..compat import SHIM_PATH
from .hosts import HostSlots, HostSpecError, assign_ranks, is_local_host, parse_hostfile, parse_hosts
from .local import spawn_local
from .output import OutputRelay
from .rendezvous import RendezvousServer
from .supervisor import Supervisor, Worker, report_failure
from .tuning import add_tuning_arguments, tuning_environment
from .worker_env import worker_environment


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


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``torchring run`` (horovodrun's names)."""
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int, required=True,
                        help="number of ranks to start")
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
    add_tuning_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Validate parsed flags into a ``RunConfig``; errors are ``HostSpecError``/``ValueError``."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("no command given; usage: torchring run -np 2 python train.py")
    if args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    elif args.hosts:
        hosts = parse_hosts(args.hosts)
    else:
        hosts = [HostSlots("localhost", max(args.num_proc, 1))]
    ranks_to_show = None
    if args.ranks is not None:
        try:
            ranks_to_show = frozenset(int(r) for r in args.ranks.split(",") if r.strip())
        except ValueError:
            raise ValueError(f"--ranks {args.ranks!r}: expected rank numbers separated by commas") from None
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port {args.port} is not a valid port")
    return RunConfig(args.num_proc, hosts, command, args.port, ranks_to_show, args.verbose, args.horovod_compat,
                     tuning_environment(args))


def run_job(config: RunConfig) -> int:
    """Start every rank, relay output, and return the job's exit code."""
    assignments = assign_ranks(config.hosts, config.num_proc)
    remote = sorted({slot.hostname for slot in assignments if not is_local_host(slot.hostname)})
    if remote:
        raise HostSpecError(f"host(s) {', '.join(remote)} are not this machine; this version of torchring "
                            "starts ranks on the local host only")
    server = RendezvousServer("127.0.0.1", config.port)
    if config.verbose:
        print(f"torchring run: {config.num_proc} ranks on this host, rendezvous at 127.0.0.1:{server.port}",
              file=sys.stderr)
    supervisor = Supervisor(peer_failure=server.peer_failure)
    previous = {sig: signal.signal(sig, lambda signum, _frame: supervisor.request_stop(signum))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for slot in assignments:
            env = worker_environment({**os.environ, **config.tuning}, slot, "127.0.0.1", server.port)
            if config.horovod_compat:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM_PATH), env.get("PYTHONPATH")) if p)
            process = spawn_local(config.command, env)
            show = config.ranks_to_show is None or slot.rank in config.ranks_to_show
            relays = (
                OutputRelay(slot.rank, "stdout", process.stdout, sys.stdout.buffer, show=show),
                OutputRelay(slot.rank, "stderr", process.stderr, sys.stderr.buffer, show=show),
            )
            supervisor.add(Worker(slot.rank, slot.hostname, process, relays))
        for worker in supervisor.workers:
            for relay in worker.relays:
                relay.start()
        failure = supervisor.wait()
    except BaseException:
        supervisor.terminate_all()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is None:
        return 0
    report_failure(failure, supervisor.workers)
    return failure.exit_code
