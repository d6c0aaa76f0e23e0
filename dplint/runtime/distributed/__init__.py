"""Distributed training at runtime: run code on N CPU ranks in a real gloo process group, with checks.

    from dplint.runtime.distributed import launch

    results = launch(train, config, nprocs=2, timeout=10)  # one result per rank

Each rank gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), NCCL runs as gloo, CUDA is hidden, and the checks in `dplint.runtime.distributed.checks` watch
samplers, loaders, collectives, parameters and checkpoints. `dplint run --nproc-per-node N script.py`
does the same for a script; `@pytest.mark.dplint(ranks=N)` for a test.
"""

from dplint.runtime.distributed.errors import DistributedPitfall, LaunchError, RankFailure
from dplint.runtime.distributed.launcher import ALL_CHECKS, launch

__all__ = ["ALL_CHECKS", "DistributedPitfall", "LaunchError", "RankFailure", "launch"]
