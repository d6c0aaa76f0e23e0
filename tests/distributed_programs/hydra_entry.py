"""A hydra entry point: `@hydra.main` catches the error of a rank, prints it and exits 1."""

import hydra
import torch.distributed as dist
from omegaconf import DictConfig


def load_shard(rank: int) -> None:
    if rank == 1:
        raise ValueError("no such shard")  # rank 1 fails


@hydra.main(version_base=None, config_path=None)
def main(cfg: DictConfig) -> None:
    dist.init_process_group("gloo")
    load_shard(dist.get_rank())
    dist.barrier()


if __name__ == "__main__":
    main()
