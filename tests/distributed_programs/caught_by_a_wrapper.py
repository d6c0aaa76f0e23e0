"""A script whose entry point catches every error and exits 1, as hydra's and fire's wrappers do."""

import sys

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("no such shard")  # rank 1 fails
    dist.barrier()


if __name__ == "__main__":
    try:
        main()
    except Exception as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
