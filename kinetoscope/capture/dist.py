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
