"""The flags of Horovod 0.28.1's ``horovodrun`` that ``torchring run`` has no flag of its own for, so that job
files and scripts that carry them run unchanged (``horovodrun`` and ``torchring run`` share them).

Each is one of three kinds (``docs/horovod-migration.md`` has the table):

* **implemented**: the mechanism exists here (the timestamp flags, ``--stall-check``,
  ``--no-timeline-mark-cycles``; ``--disable-cache`` and ``--gloo-timeout-seconds`` are with the other tuning
  flags in ``tuning``): the flag sets the setting the ranks read, or the launcher's output prefix;
* **mapped**: torch does the job itself (``--hierarchical-allreduce``, ``--hierarchical-allgather``,
  ``--torus-allreduce``: NCCL picks ring or tree algorithms per topology on its own): accepted, one line
  says so;
* **no meaning here** (MPI, NCCL stream and CPU-binding knobs): accepted, one line says why.

``--autotune`` and its flags are implemented: they set the ``TORCHRING_AUTOTUNE*`` settings the ranks'
autotuner reads (``optim.autotune``; the ``HOROVOD_AUTOTUNE*`` variables work as well).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["add_horovod_flags", "horovod_flag_effects"]

#: Mapped flags: what torch (NCCL) does in their place.
MAPPED = {
    "hierarchical_allreduce": "NCCL chooses its own ring or tree algorithms across and within hosts",
    "hierarchical_allgather": "NCCL chooses its own ring or tree algorithms across and within hosts",
    "torus_allreduce": "NCCL chooses its own ring or tree algorithms across and within hosts",
}
#: Flags with no meaning on torch.distributed: attribute -> (flag, why).
NO_MEANING = {
    "mpi_threads_disable": ("--mpi-threads-disable", "no MPI runs here"),
    "mpi_args": ("--mpi-args", "no mpirun is started (Gloo and NCCL carry the collectives)"),
    "tcp_flag": ("--tcp", "Gloo always runs over TCP here; NCCL picks its own transport"),
    "binding_args": ("--binding-args", "no mpirun or jsrun binds the ranks here"),
    "num_nccl_streams": ("--num-nccl-streams", "each torch NCCL group has its own stream"),
    "thread_affinity": ("--thread-affinity", "torchring pins no background thread to a core"),
}
#: The autotuner's numeric flags: attribute (``TORCHRING_<ATTRIBUTE>`` is the setting), type, help.
AUTOTUNE_NUMBERS = (
    ("autotune_warmup_samples", int, "autotune samples discarded at the start (default 3)"),
    ("autotune_steps_per_sample", int, "optimizer steps per autotune sample (default 10)"),
    ("autotune_bayes_opt_max_samples", int, "autotune samples before the best values are kept (default 20)"),
    ("autotune_gaussian_process_noise", float, "noise term of the autotuner's Gaussian process (default 0.8)"),
)


def add_horovod_flags(parser: argparse.ArgumentParser) -> None:
    """horovodrun's remaining flags, with horovodrun's spellings and negations."""
    group = parser.add_argument_group("horovodrun's other flags (accepted so that Horovod job files run unchanged)")
    group.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", dest="prefix_output_with_timestamp",
                       action="store_true", help="start every relayed line of the ranks with the time")
    group.add_argument("--log-without-timestamp", "--log-hide-timestamp", dest="log_hide_timestamp",
                       action="store_const", const=True, help="leave the time out of torchring's log lines")
    group.add_argument("--log-with-timestamp", "--no-log-hide-timestamp", dest="log_hide_timestamp",
                       action="store_const", const=False, help="keep the time in torchring's log lines (default)")
    group.add_argument("--stall-check", dest="stall_check", action="store_true",
                       help="keep the stall inspector on (the default; undoes --no-stall-check of a config file)")
    group.add_argument("--no-timeline-mark-cycles", dest="no_timeline_mark_cycles", action="store_true",
                       help="do not mark engine cycles in the timeline (the default)")
    for attribute in MAPPED:
        flag = attribute.replace("_", "-")
        group.add_argument(f"--{flag}", dest=attribute, action="store_const", const=True,
                           help="accepted: NCCL chooses its own algorithms")
        group.add_argument(f"--no-{flag}", dest=attribute, action="store_const", const=False,
                           help=argparse.SUPPRESS)
    group.add_argument("--autotune", dest="autotune", action="store_const", const=True,
                       help="tune the cycle time, fusion threshold and gradient bucket size while training "
                            "(docs/tuning.md)")
    group.add_argument("--no-autotune", dest="autotune", action="store_const", const=False, help=argparse.SUPPRESS)
    group.add_argument("--autotune-log-file", help="rank 0 writes every autotune sample here (Horovod's CSV)")
    for attribute, kind, text in AUTOTUNE_NUMBERS:
        group.add_argument(f"--{attribute.replace('_', '-')}", type=kind, help=text)
    group.add_argument("--mpi-threads-disable", dest="mpi_threads_disable", action="store_const", const=True,
                       help="accepted; no MPI runs here")
    group.add_argument("--no-mpi-threads-disable", dest="mpi_threads_disable", action="store_const", const=False,
                       help=argparse.SUPPRESS)
    group.add_argument("--mpi-args", help="accepted; no mpirun is started")
    group.add_argument("--tcp", dest="tcp_flag", action="store_true", help="accepted; Gloo always uses TCP")
    group.add_argument("--binding-args", help="accepted; nothing binds the ranks here")
    group.add_argument("--num-nccl-streams", type=int, help="accepted; each NCCL group has its own stream")
    group.add_argument("--thread-affinity", type=int, help="accepted; no background thread is pinned")


def horovod_flag_effects(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, str]:
    """The variables the given flags set for every rank beyond ``tuning.py``'s table (``TORCHRING_*`` names:
    flags win over the environment); says once what a mapped or meaningless flag does here."""
    env: dict[str, str] = {}  # --disable-cache and --gloo-timeout-seconds are in tuning.py's flag table
    if args.log_hide_timestamp is not None:  # both ways (the table writes only flags that are on)
        env["TORCHRING_LOG_HIDE_TIME"] = "1" if args.log_hide_timestamp else "0"
    if args.stall_check and args.no_stall_check:
        raise ValueError("--stall-check and --no-stall-check contradict each other")
    if args.no_timeline_mark_cycles and args.timeline_mark_cycles:
        raise ValueError("--timeline-mark-cycles and --no-timeline-mark-cycles contradict each other")
    mapped = [attribute for attribute in MAPPED if getattr(args, attribute)]
    if mapped:
        flags = ", ".join(f"--{attribute.replace('_', '-')}" for attribute in mapped)
        say(f"{flags}: {MAPPED[mapped[0]]}; torchring passes no mode of its own")
    ignored = [(flag, why) for attribute, (flag, why) in NO_MEANING.items()
               if getattr(args, attribute) not in (None, False)]
    for flag, why in ignored:
        say(f"{flag} has no effect here: {why}")
    if args.autotune is not None:
        env["TORCHRING_AUTOTUNE"] = "1" if args.autotune else "0"
    if args.autotune_log_file:
        env["TORCHRING_AUTOTUNE_LOG"] = args.autotune_log_file
    for attribute, _, _ in AUTOTUNE_NUMBERS:
        value = getattr(args, attribute)
        if value is not None:
            env[f"TORCHRING_{attribute.upper()}"] = str(value)
    return env
