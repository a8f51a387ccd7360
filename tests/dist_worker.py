"""One rank of ``test_distributed.py``, started by ``torchrun`` (gloo, CPU).

Loads this rank's share of an S3 checkpoint through this rank's own endpoint (the test
gives each rank a proxy, to see which objects each rank read), samples from it, and
all-gathers what it holds; rank 0 writes everything to ``--result`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from benchmarks.s3_server import s3_storage_options
from rbzarr import TrajectoryReplayBuffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="s3:// URL of the checkpoint")
    parser.add_argument("--result", required=True, help="where rank 0 writes the JSON result")
    parser.add_argument("--samples", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    endpoint = json.loads(os.environ["RBZARR_TEST_S3_ENDPOINTS"])[rank]
    buffer = TrajectoryReplayBuffer(seed=100 + rank, storage_options=s3_storage_options(endpoint))
    buffer.load_checkpoint(
        args.checkpoint, is_distributed=True, local_rank=local_rank, world_size=world_size
    )
    numbers = buffer.sample(args.samples)["prev_logprobs"].to(torch.int64)
    mine = {
        "rank": rank,
        "ids": buffer.trajectory_ids,
        "size": len(buffer),
        "total_samples": buffer.total_samples,
        "trajectory_counter": buffer.trajectory_counter,
        "sampled": numbers.tolist(),
    }
    gathered: list[dict | None] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(args.result, "w") as handle:
            json.dump({"world_size": world_size, "ranks": gathered}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
