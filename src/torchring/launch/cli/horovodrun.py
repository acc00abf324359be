"""The ``horovodrun`` command installed with torchring: ``torchring run --horovod-compat`` under
horovodrun's name, so that ``horovodrun -np 4 -H localhost:4 python train_hvd.py`` runs as the Horovod
guides write it.

It takes every flag of ``torchring run`` (the same parser and the same launcher), plus horovodrun's
spellings that torchring has no use for: ``--gloo`` is accepted (torchring always runs on
torch.distributed, Gloo for CPU tensors and NCCL for CUDA tensors), ``--network-interfaces a,b`` is
``--network-interface a --network-interface b``, and ``--mpi``/``--jsrun`` are refused with what to do
instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ...version import __version__
from .arguments import add_run_arguments
from .run_command import OneLineErrorParser, run_command

__all__ = ["build_parser", "main"]

PROG = "horovodrun"

#: horovodrun's controllers torchring does not have: flag -> why, and what to do instead.
REFUSED = {
    "--mpi": "torchring starts its ranks itself and runs them on torch.distributed (Gloo/NCCL), not on MPI; "
             "leave --mpi out (or start the ranks with mpirun yourself: hvd.init() finds them there)",
    "--jsrun": "torchring starts its ranks itself (locally or over SSH), not with jsrun; leave --jsrun out",
}


def build_parser() -> argparse.ArgumentParser:
    """``torchring run``'s parser under the name ``horovodrun``, with horovodrun's extra spellings."""
    parser = OneLineErrorParser(
        prog=PROG,
        description=f"torchring's horovodrun (torchring {__version__}): 'torchring run --horovod-compat' with "
                    "horovodrun's flags. Scripts that 'import horovod.torch as hvd' run unchanged on torchring; "
                    "this is not Horovod's own horovodrun.")
    parser.add_argument("-v", "--version", action="version", version=f"horovodrun from torchring {__version__}")
    add_run_arguments(parser)
    compat = parser.add_argument_group("horovodrun compatibility")
    compat.add_argument("--gloo", action="store_true",
                        help="accepted for horovodrun's sake: torchring always uses Gloo (CPU) and NCCL (CUDA)")
    compat.add_argument("--network-interfaces", dest="network_interfaces_list", metavar="NICS",
                        help="comma-separated interfaces the hosts talk over (as --network-interface)")
    for flag, why in REFUSED.items():
        compat.add_argument(flag, action="store_true", help=f"refused: {why.split(';')[0]}")
    parser.set_defaults(horovod_compat=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``horovodrun`` console script."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return run_command(build_parser(), arguments, PROG, _horovodrun_flags)


def _horovodrun_flags(args: argparse.Namespace) -> None:
    """Refuse ``--mpi``/``--jsrun`` (``ValueError``); ``--network-interfaces a,b`` adds to
    ``--network-interface``'s list."""
    for flag, why in REFUSED.items():
        if getattr(args, flag.lstrip("-")):
            raise ValueError(f"{flag}: {why}")
    if args.network_interfaces_list:
        args.network_interface += [name.strip() for name in args.network_interfaces_list.split(",") if name.strip()]
