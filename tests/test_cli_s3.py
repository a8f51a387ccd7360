"""The ``rbzarr`` command against the S3 test server, through ``--storage-option``."""

from __future__ import annotations

import json

import pytest
from conftest import make_trajectory
from test_cli import rbzarr

from rbzarr import TrajectoryReplayBuffer

pytestmark = pytest.mark.s3


def options_flags(options: dict) -> list[str]:
    flags = []
    for key, value in options.items():
        flags += ["--storage-option", f"{key}={json.dumps(value)}"]
    return flags


def test_info_ls_verify_export_on_s3(s3_bucket, s3_direct_options, tmp_path):
    url = f"s3://{s3_bucket}/store"
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3_direct_options
    ) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, 0), make_trajectory(2, 3, 8)])
    flags = options_flags(s3_direct_options)
    listing = rbzarr(*flags, "ls", url, "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert [row["trajectory_id"] for row in rows] == [0, 1]
    info = rbzarr(*flags, "info", url, "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["total_samples"] == 14
    verify = rbzarr(*flags, "verify", url, "--json")
    assert verify.returncode == 0, verify.stderr
    exported = rbzarr(*flags, "export", url, tmp_path / "local", "--format", "pt")
    assert exported.returncode == 0, exported.stderr
    restored = TrajectoryReplayBuffer(sample_window_size=0)
    restored.load_checkpoint(tmp_path / "local")
    assert len(restored) == 2 and restored.total_samples == 14


def test_missing_bucket_is_one_line(moto_endpoint, s3_direct_options):
    result = rbzarr(*options_flags(s3_direct_options), "info", "s3://no-such-bucket-xyz/store")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
