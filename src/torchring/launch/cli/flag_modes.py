"""Which ``torchring run`` flags apply to which kind of job. A flag that cannot apply to the job's mode
(fixed: ``-np``; elastic: ``--min-np``/``--max-np``/``--host-discovery-script``) is refused with an error
that names it and says what to do, never ignored. docs/launcher.md has the table for every flag."""

from __future__ import annotations

import argparse

#: Flags only an elastic job uses: (attribute, flag).
ELASTIC_ONLY = (
    ("slots_per_host", "--slots-per-host"),
    ("reset_limit", "--reset-limit"),
    ("blacklist_cooldown_range", "--blacklist-cooldown-range"),
    ("elastic_timeout", "--elastic-timeout"),
    ("spares", "--spares"),
)

#: Flags an elastic job cannot honour: (attribute, flag, why and what to do).
NOT_FOR_ELASTIC = (
    ("timeline_filename", "--timeline-filename",
     "rank 0 of every generation rewrites the file, so it would only hold the trace since the last membership "
     "change; record a timeline in a fixed-size run (-np N without --min-np, --max-np and "
     "--host-discovery-script)"),
)

HOROVOD_COMPAT_IN_CONTAINERS = (
    "--horovod-compat cannot reach into --image containers: the shim is a directory of this host's torchring "
    "installation. Leave --horovod-compat out and put the shim of the image's torchring on the image's "
    "PYTHONPATH (its path: python -c 'import torchring.compat as c; print(c.SHIM_PATH)' run in the image), "
    "e.g. with --env PYTHONPATH=PATH"
)


def _given(args: argparse.Namespace, attribute: str) -> bool:
    return getattr(args, attribute) not in (None, False, [], "")


def check_flags_for_mode(args: argparse.Namespace, elastic: bool) -> None:
    """``ValueError`` naming the first flag given that the job's mode cannot honour."""
    if elastic:
        for attribute, flag, why in NOT_FOR_ELASTIC:
            if _given(args, attribute):
                raise ValueError(f"{flag} does not apply to elastic jobs: {why}")
    else:
        for attribute, flag in ELASTIC_ONLY:
            if _given(args, attribute):
                raise ValueError(f"{flag} applies to elastic jobs only; add --min-np/--max-np or "
                                 f"--host-discovery-script to make the job elastic, or leave {flag} out")
    if args.horovod_compat and args.image:
        raise ValueError(HOROVOD_COMPAT_IN_CONTAINERS)
