"""What users read when they get something wrong: the thing and the fix, in a line or two."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from conftest import make_trajectory

from rbzarr import (
    CheckpointNotFoundError,
    EmptyBufferError,
    ReplayDataset,
    TrajectoryReplayBuffer,
    open_buffer,
)


def test_loading_a_file_says_a_store_folder_is_expected(tmp_path):
    path = tmp_path / "buffer.pt"
    path.write_bytes(b"not a store")
    buffer = TrajectoryReplayBuffer()
    with pytest.raises(CheckpointNotFoundError, match="is a file, expected a store folder"):
        buffer.load_checkpoint(path)
    assert path.read_bytes() == b"not a store" and len(buffer) == 0


def test_an_s3_url_without_s3fs_names_the_extra_to_install():
    script = (
        "import sys; sys.modules['s3fs'] = None\n"  # as if s3fs were not installed
        "from rbzarr import open_buffer\n"
        "try:\n"
        "    open_buffer('s3://bucket/store')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout == (
        "s3://bucket/store: S3 needs s3fs, in rbzarr's s3 extra: pip install 'rbzarr[s3]'\n"
    )


@pytest.mark.parametrize("window", ["10", 2.5, 10.0, True, None])
def test_a_window_that_is_not_an_int_is_a_type_error(window):
    with pytest.raises(TypeError, match="sample_window_size must be an int"):
        TrajectoryReplayBuffer(sample_window_size=window)


def test_a_negative_window_means_every_trajectory_as_zero_does():
    trajectories = [make_trajectory(4, 2, 8 * k) for k in range(3)]
    drawn = []
    for window in (0, -5):
        buffer = TrajectoryReplayBuffer(seed=3, sample_window_size=window)
        buffer.add_trajectories(trajectories)
        drawn.append(buffer.sample(64)["prev_logprobs"])
    assert drawn[0].tolist() == drawn[1].tolist() and max(drawn[0].tolist()) >= 16


def test_an_auto_save_path_without_auto_save_warns_once_and_writes_nothing(tmp_path):
    store = tmp_path / "store"
    with pytest.warns(UserWarning, match="ignored without auto_save=True") as caught:
        buffer = TrajectoryReplayBuffer(auto_save_path=store)
    assert len(caught) == 1
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.close()
    assert not store.exists()


def test_a_new_buffer_over_a_full_store_says_it_could_load_it(tmp_path):
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as earlier:
        earlier.add_trajectories([make_trajectory(4, 2, 0)])
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        with pytest.raises(EmptyBufferError, match=r"load_checkpoint\('.*store'\)"):
            buffer.sample(4)
        buffer.load_checkpoint(store)
        assert buffer.sample(4)["rewards"].shape == (4, 1)
    with pytest.raises(EmptyBufferError, match=r"add trajectories first$"):
        TrajectoryReplayBuffer().sample(4)


def test_batches_clamped_to_a_small_window_warn_once():
    buffer = TrajectoryReplayBuffer(seed=0)
    buffer.add_trajectories([make_trajectory(4, 2, 0)])  # 8 rows
    dataset = ReplayDataset(buffer, batch_size=32, num_batches=3, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shapes = [batch["rewards"].shape for batch in dataset.data_loader()]
    assert shapes == [(8, 1)] * 3
    messages = [str(w.message) for w in caught if w.category is UserWarning]
    assert messages == [
        "ReplayDataset: a batch has 8 rows, not batch_size=32: the buffer's sampling window "
        "holds fewer (it clamps, as RLinf's does); add trajectories or lower batch_size for "
        "full batches"
    ]


def test_opening_a_file_is_a_permanent_error_that_says_so(tmp_path):
    path = tmp_path / "run.pt"
    path.write_bytes(b"not a store")
    with pytest.raises(
        CheckpointNotFoundError, match=r"run\.pt is a file, expected a store folder"
    ):
        open_buffer(str(path))
    with pytest.raises(
        CheckpointNotFoundError, match=r"run\.pt is a file, expected a store folder"
    ):
        open_buffer(str(path / "inner"))
    assert path.read_bytes() == b"not a store"


def test_opening_a_missing_folder_names_it(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match=r"no folder .*nothing-here: check the path"):
        open_buffer(str(tmp_path / "nothing-here"))


@pytest.mark.s3
def test_opening_a_store_in_a_missing_bucket_says_the_bucket_is_missing(s3_options):
    with pytest.raises(
        CheckpointNotFoundError, match=r"the bucket 'nosuchbucket' does not exist .* create it"
    ):
        open_buffer("s3://nosuchbucket/run", s3_options)
