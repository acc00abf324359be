"""The ``torchring`` command: ``run``, ``dump``, ``bench``, ``doctor``, ``timeline``, ``k8s``, ``horovod-shim``
and ``--version``."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from .launch.cli.arguments import add_run_arguments
from .launch.cli.run_command import OneLineErrorParser, run_command
from .version import __version__

RUN_DESCRIPTION = "Start NP ranks of COMMAND and supervise them."


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: ``run`` and every other subcommand (their modules load here, not for ``run``)."""
    from .bench.cli import add_bench_arguments
    from .deploy.k8s_cli import add_k8s_arguments
    from .diagnostics.doctor.cli import add_doctor_arguments
    from .diagnostics.timeline.cli import add_timeline_arguments
    from .launch.watch.dump import add_dump_arguments

    parser = OneLineErrorParser(prog="torchring", description="Distributed PyTorch training, Horovod style.")
    parser.add_argument("--version", action="version", version=f"torchring {__version__}")
    commands = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    run = commands.add_parser("run", help="start a training job's ranks", description=RUN_DESCRIPTION)
    add_run_arguments(run)
    parser.set_defaults(run_parser=run)
    dump = commands.add_parser("dump", help="print where every rank of running jobs is (SIGUSR1 to their launchers)",
                               description="Ask running 'torchring run' launchers (these pids, else all of this "
                                           "user's on this host) for the stacks of their ranks, and print them.")
    add_dump_arguments(dump)
    doctor = commands.add_parser("doctor", help="check this host (and others over SSH) for what training needs",
                                 description="Check versions, CUDA/NCCL, shared memory, network and settings on "
                                             "this host or on -H hosts; exit 1 when something blocks training.")
    add_doctor_arguments(doctor)
    timeline = commands.add_parser("timeline", help="analyse a timeline file",
                                   description="Analyse a timeline written with --timeline-filename/HOROVOD_TIMELINE.")
    add_timeline_arguments(timeline)
    k8s = commands.add_parser("k8s", help="print Kubernetes manifests for a training job",
                              description="Print an Indexed Job + headless Service, or a Kubeflow PyTorchJob.")
    add_k8s_arguments(k8s)
    bench = commands.add_parser("bench", help="benchmark collectives and training (starts its own ranks)",
                                description="Benchmark torchring against raw torch.distributed, DDP and Horovod.")
    add_bench_arguments(bench)
    shim = commands.add_parser("horovod-shim", help="make `import horovod.torch` torchring in this Python environment",
                               description="Install (or remove) torchring's horovod shim for every process of this "
                                           "Python environment, for launchers that cannot add it themselves "
                                           "(mpirun, srun). torchring run --horovod-compat needs none of this.")
    shim.add_argument("action", choices=("install", "remove", "status"))
    return parser


def _horovod_shim(action: str) -> int:
    from .compat import site_shim

    if action == "status":
        print(site_shim.status())
        return 0
    if action == "remove":
        removed = site_shim.remove()
        target = site_shim.site_packages() / site_shim.PTH_NAME
        print(f"removed {removed}" if removed else f"nothing to remove: {target} does not exist")
        return 0
    try:
        target = site_shim.install()
    except (site_shim.ShimError, OSError) as error:
        print(f"torchring horovod-shim: error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {target}: `import horovod.torch` is torchring for every process of this environment "
          "(undo: torchring horovod-shim remove)")
    return 0


def _run_parser() -> argparse.ArgumentParser:
    """``torchring run``'s parser alone: the launcher then loads none of the other subcommands' modules."""
    parser = OneLineErrorParser(prog="torchring run", description=RUN_DESCRIPTION)
    add_run_arguments(parser)
    return parser


def _bench(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from .bench.cli import BenchJobError, BenchUsageError, run_bench
    from .launch.hosts import HostSpecError

    try:
        return run_bench(args, argv)
    except (HostSpecError, BenchUsageError) as error:
        print(f"torchring bench: error: {error}", file=sys.stderr)
        return 2
    except BenchJobError as error:
        print(f"torchring bench: error: {error}", file=sys.stderr)
        return error.exit_code
    except OSError as error:
        print(f"torchring bench: error: {error}", file=sys.stderr)
        return 1


def console() -> None:
    """The ``torchring`` console script and ``python -m torchring``: :func:`main`, then exit.

    Once the command is done (its processes ended, its files closed, its clean-up run), the objects it
    still holds, torch's modules above all, are frozen out of the garbage collector: the interpreter's
    last collections then skip them, which saves about 0.4 s of CPU per command; memory goes back to
    the system at exit either way."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``torchring`` command on ``argv`` (default: the command line); its exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["run"]:
        return run_command(_run_parser(), arguments[1:], "torchring run")
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.subcommand is None:
        parser.print_help()
        return 2
    if args.subcommand == "bench":
        return _bench(args, argv)
    if args.subcommand == "dump":
        from .launch.watch.dump import run_dump

        return run_dump(args)
    if args.subcommand == "doctor":
        from .diagnostics.doctor.cli import run_doctor

        return run_doctor(args)
    if args.subcommand == "timeline":
        from .diagnostics.timeline.cli import run_timeline

        return run_timeline(args)
    if args.subcommand == "horovod-shim":
        return _horovod_shim(args.action)
    if args.subcommand == "k8s":
        from .deploy.k8s_cli import run_k8s

        return run_k8s(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
