"""Which rank this process is, from torch.distributed or the launcher's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    source: str  # "torch.distributed" | "environment" | "default"


def rank_info() -> RankInfo:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return RankInfo(
                dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)), "torch.distributed"
            )
    except Exception:  # noqa: BLE001
        pass
    env = os.environ
    if "RANK" in env and env["RANK"].isdigit():
        return RankInfo(
            int(env["RANK"]), int(env.get("WORLD_SIZE", "1") or 1), int(env.get("LOCAL_RANK", "0") or 0), "environment"
        )
    return RankInfo(0, 1, 0, "default")


#: launchers' names for how many of the job's processes run on this host (torchrun and accelerate, Open MPI, MPICH,
#: Slurm): the cores a rank may count on are the host's shared among them
_RANKS_ON_HOST_ENV = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE")


def ranks_on_host(world_size: int) -> int | None:
    """How many of the job's ranks run on this host: 1 for a single process, the launcher's word for a job of
    several (at most the world size: Slurm's count is inherited by every process of an allocation), None where no
    launcher said (never guessed from the world size: ranks may span hosts)."""
    if world_size <= 1:
        return 1
    for name in _RANKS_ON_HOST_ENV:
        value = os.environ.get(name, "").strip()
        # Slurm's "2(x3)" (uneven nodes) is not one number: passed over; isdecimal, not isdigit ("²" is a digit)
        if value.isdecimal() and int(value) > 0:
            return min(int(value), world_size)
    return None
