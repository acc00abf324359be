"""Ranks started by ``srun`` inside a Slurm allocation.

Rank, size and local rank come from the job step's variables. Rank 0 serves the store on the step's
first node, at ``MASTER_ADDR``/``MASTER_PORT`` (or ``TORCHRING_STORE_ADDR``/``_PORT``) when set, else on
a port derived from the job and step ids. The job's secret is ``TORCHRING_JOB_SECRET`` from the batch
environment (``srun`` hands every task the environment it was started with; never put the secret on
a command line); without it the store's values are signed with an empty key (integrity only), and
rank 0 says how to set one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..contract import JOB_SECRET, STORE_ADDR
from .base import ClusterEnvironment, RankInfo, Rendezvous
from .slurm_lists import expand_hostlist

logger = logging.getLogger("torchring")

#: The derived store ports are ``PORT_BASE`` .. ``PORT_BASE + PORT_SPAN - 1``.
PORT_BASE, PORT_SPAN = 20000, 20000

SECRET_HINT = (f"export {JOB_SECRET}=$(python3 -c 'import secrets; print(secrets.token_hex(32))') in the batch "
               "script before srun")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list such as ``gpu[03-05,09],cpu1`` (here ``gpu03``)."""
    return expand_hostlist(nodelist)[0]


def derived_port(job_id: int, step_id: int) -> int:
    """The store's port for one job step when none is given: two steps of a job running at once differ."""
    return PORT_BASE + (job_id * 17 + step_id) % PORT_SPAN


class SlurmEnvironment(ClusterEnvironment):
    """``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``... inside a job step."""

    name = "Slurm"
    #: Whether rank 0 of this process already said the job has no secret.
    _warned_no_secret = False

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return bool(env.get("SLURM_PROCID")) and bool(env.get("SLURM_STEP_ID"))

    def rank_info(self) -> RankInfo:
        return RankInfo(
            rank=self.required_integer("SLURM_PROCID"),
            size=self.required_integer("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
            local_rank=self.integer("SLURM_LOCALID"),
            hostname=self.env.get("SLURMD_NODENAME") or None,
        )

    def prepare(self) -> None:
        """Rank 0 says once when the job has no secret (the store then only checks integrity)."""
        if self.env.get(JOB_SECRET) or self.env.get("SLURM_PROCID") != "0" or SlurmEnvironment._warned_no_secret:
            return
        SlurmEnvironment._warned_no_secret = True
        logger.warning("torchring: this Slurm job has no %s, so its store's values are signed with an empty key "
                       "(integrity only): anyone who reaches the store's port could join it; %s",
                       JOB_SECRET, SECRET_HINT)

    def rendezvous(self) -> Rendezvous:
        serve = self.rank_info().rank == 0
        if not (self.env.get("MASTER_ADDR") or self.env.get(STORE_ADDR)):
            nodelist = self.env.get("SLURM_STEP_NODELIST") or self.env.get("SLURM_JOB_NODELIST")
            if nodelist:
                port = derived_port(self.integer("SLURM_JOB_ID", default=0) or 0,
                                    self.integer("SLURM_STEP_ID", default=0) or 0)
                return Rendezvous(first_host(nodelist), port, serve_store=serve)
        host, port = self.store_address(default_port=29500)
        return Rendezvous(host, port, serve_store=serve)
