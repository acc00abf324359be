"""Ranks started by ``srun`` inside a Slurm allocation."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..contract import STORE_ADDR
from .base import ClusterEnvironment, RankInfo, Rendezvous


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list such as ``gpu[03-05,09],cpu1`` (here ``gpu03``)."""
    head = re.split(r",(?![^\[]*\])", nodelist.strip(), maxsplit=1)[0]
    match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", head)
    if not match:
        return head
    prefix, ranges, suffix = match.groups()
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix}"


class SlurmEnvironment(ClusterEnvironment):
    """``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``... inside a job step."""

    name = "Slurm"

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

    def rendezvous(self) -> Rendezvous:
        if not (self.env.get("MASTER_ADDR") or self.env.get(STORE_ADDR)):
            nodelist = self.env.get("SLURM_STEP_NODELIST") or self.env.get("SLURM_JOB_NODELIST")
            if nodelist:
                job_id = self.integer("SLURM_JOB_ID", default=0) or 0
                return Rendezvous(first_host(nodelist), 20000 + job_id % 20000,
                                  serve_store=self.rank_info().rank == 0)
        host, port = self.store_address(default_port=29500)
        return Rendezvous(host, port, serve_store=self.rank_info().rank == 0)
