"""Analysis that asks for some keys reads only those: a damaged other key does not matter.

Locally a truncated ``actions`` shard fails every read that opens it, so ``stats --keys
rewards`` succeeding shows it is never opened; on S3 the proxy's log shows which arrays
were requested at all.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import make_trajectory, truncate_shard

from rbzarr import CorruptStoreError, TrajectoryReplayBuffer
from rbzarr.analysis import open_buffer
from rbzarr.analysis.stats import compute_stats
from rbzarr.cli.main import main

DAMAGED = 1


def build(url: str, options: dict[str, Any] | None = None) -> None:
    """Three trajectories, each in its own group (no pack: the damage is one trajectory's)."""
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        storage_options=options,
        layout_options={"pack_bytes": 0},
    )
    buffer.add_trajectories([make_trajectory(4, 2, 10 * k) for k in range(3)])
    buffer.close()


def truncate_actions(url: str, options: dict[str, Any] | None = None) -> None:
    """Truncate the ``actions`` shard of trajectory ``DAMAGED``."""
    truncate_shard(url, options, DAMAGED, "actions")


def test_stats_of_some_keys_never_opens_a_damaged_other_key(tmp_path):
    healthy, damaged = str(tmp_path / "healthy"), str(tmp_path / "damaged")
    build(healthy)
    build(damaged)
    truncate_actions(damaged)
    want = compute_stats(healthy, keys=["rewards"])
    assert compute_stats(damaged, keys=["rewards"]) == want
    assert compute_stats(open_buffer(damaged), keys=["rewards"]) == want
    result = CliRunner().invoke(main, ["stats", damaged, "--keys", "rewards", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["keys"] == want["keys"]
    # Reading the damaged key itself is the named error.
    with pytest.raises(CorruptStoreError, match=r"trajectories/1/actions: .*truncated"):
        compute_stats(damaged, keys=["actions"])
    view = open_buffer(damaged)
    assert list(view.trajectory(DAMAGED, ["rewards"]).rewards.flatten()) == list(range(10, 18))


def arrays_requested(keys: list[str]) -> set[str]:
    """The array names below ``trajectories/<id>/`` that requests touched."""
    found = set()
    for key in keys:
        match = re.search(r"/trajectories/\d+/(.+?)/(c/|zarr\.json)", key)
        if match:
            found.add(match.group(1))
    return found


@pytest.mark.s3
def test_stats_of_some_keys_requests_only_those_arrays_on_s3(
    s3_bucket: str, s3_options: dict[str, Any], s3_proxy
):
    url = f"s3://{s3_bucket}/s"
    build(url, s3_options)
    s3_proxy.reset_log()
    report = compute_stats(url, keys=["rewards"], storage_options=s3_options)
    assert report["keys"]["rewards"]["count"] == 24
    # rewards, and dones for the episodes: no other array of any trajectory. Shards this
    # small are read from the copies in the group documents: no request for them either.
    keys = [r.key for r in s3_proxy.requests]
    assert arrays_requested(keys) == set()
    assert sum(key.endswith("/zarr.json") for key in keys) >= 3  # each trajectory's group
    # Shards too large to copy there (T=1024, B=4: 32 KiB of rewards) are fetched: only those.
    big = f"s3://{s3_bucket}/big"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=big, storage_options=s3_options)
    buffer.add_trajectories([make_trajectory(1024, 4, 0)])
    buffer.close()
    s3_proxy.reset_log()
    assert compute_stats(big, keys=["rewards"], storage_options=s3_options)["keys"]["rewards"][
        "count"
    ] == (1024 * 4)
    assert arrays_requested([r.key for r in s3_proxy.requests]) == {"rewards", "dones"}
