"""``torchrun --nproc_per_node=2``: each rank loads its share of an S3 checkpoint."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_trajectory

from benchmarks.s3_server import S3Proxy
from rbzarr import TrajectoryReplayBuffer

pytestmark = pytest.mark.s3

WORKER = Path(__file__).with_name("dist_worker.py")
SIZES = [(4, 2), (3, 2), (5, 2), (2, 2), (4, 2)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ranks_load_disjoint_complete_shares_from_s3(
    tmp_path: Path,
    moto_endpoint: str,
    s3_proxy: S3Proxy,
    s3_bucket: str,
    s3_direct_options: dict[str, Any],
):
    checkpoint = f"s3://{s3_bucket}/ckpt"
    writer = TrajectoryReplayBuffer(storage_options=s3_direct_options)
    bases, base = [], 0
    for T, B in SIZES:
        writer.add_trajectories([make_trajectory(T, B, base)])
        bases.append(base)
        base += T * B
    writer.save_checkpoint(checkpoint)

    second = S3Proxy(moto_endpoint)  # one endpoint per rank: each proxy logs one rank
    proxies = [s3_proxy, second]
    try:
        env = {
            **os.environ,
            "RBZARR_TEST_S3_ENDPOINTS": json.dumps([p.endpoint_url for p in proxies]),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
            # the worker imports the S3 helpers of benchmarks/ from the repository root
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *sys.path]),
        }
        result = tmp_path / "result.json"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(WORKER),
            "--checkpoint",
            checkpoint,
            "--result",
            str(result),
        ]
        done = subprocess.run(
            command, check=False, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        ranks = json.loads(result.read_text())["ranks"]
        read = [
            {int(m[1]) for r in p.requests if (m := re.search(r"/ckpt/trajectories/(\d+)/", r.key))}
            for p in proxies
        ]
    finally:
        second.close()

    # RLinf's split of 5 ids over 2 ranks: 3 + 2, disjoint and together complete.
    assert [r["ids"] for r in ranks] == [[0, 1, 2], [3, 4]]
    for rank, info in enumerate(ranks):
        share = info["ids"]
        assert info["size"] == len(share)
        assert info["total_samples"] == sum(SIZES[i][0] * SIZES[i][1] for i in share)
        assert info["trajectory_counter"] == max(share) + 1
        # Every sampled row comes from this rank's share ...
        owners = {max(i for i, b in enumerate(bases) if b <= n) for n in info["sampled"]}
        assert owners <= set(share)
        # ... and this rank read exactly its share's trajectories from S3.
        assert read[rank] == set(share)
