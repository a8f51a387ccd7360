"""``on_damaged``: a damaged or missing trajectory met while sampling, locally and on S3.

The default names the trajectory (``CorruptStoreError``); ``on_damaged="skip"`` drops it
from the window with one warning and draws the batch again, so the batches are exactly
those of a buffer that never held the damaged trajectories.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
import torch
from conftest import assert_rows_consistent, make_trajectory, truncate_shard

from rbzarr import CorruptStoreError, DamagedTrajectoryWarning, TrajectoryReplayBuffer
from rbzarr.analysis import BufferView, open_buffer
from rbzarr.data.sources import store_spec
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr import remote

TRUNCATED, DELETED = 1, 3
COUNT = 6  # trajectories of 4 x 2 rows; row i of trajectory k encodes 10 * k + i


@pytest.fixture(autouse=True)
def _every_shard_read_from_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shards here are tiny: keep them out of the group documents (an S3 reader would
    read those copies and never meet the truncated file)."""
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)


def stored_buffer(url: str, options: dict[str, Any] | None, skip: tuple[int, ...] = (), **kw: Any):
    """A buffer whose rows all come from its store (no cache), holding trajectories
    ``k`` of ``range(COUNT)`` but ``skip``, each in its own group (no pack: the damage is
    one trajectory's)."""
    buffer = TrajectoryReplayBuffer(
        seed=7,
        enable_cache=False,
        auto_save=True,
        auto_save_path=url,
        storage_options=options,
        **({"layout_options": {"pack_bytes": 0}} if kw.get("trajectory_format") is None else {}),
        **kw,
    )
    buffer.add_trajectories([make_trajectory(4, 2, 10 * k) for k in range(COUNT) if k not in skip])
    buffer.flush()
    return buffer


def damage(url: str, options: dict[str, Any] | None) -> None:
    """Truncate one shard of trajectory ``TRUNCATED``; delete trajectory ``DELETED``'s folder."""
    truncate_shard(url, options, TRUNCATED, "actions")
    Location.from_url(url, options).delete("trajectories", str(DELETED))


def batches(buffer: TrajectoryReplayBuffer | BufferView, count: int = 3) -> list[list[int]]:
    return [assert_rows_consistent(buffer.sample(24)).tolist() for _ in range(count)]


def check_skip(url: str, reference_url: str, options: dict[str, Any] | None) -> None:
    """Skip-sampling the damaged store equals sampling a store without the damaged ones
    (a local one: the draws do not depend on where the rows are)."""
    buffer = stored_buffer(url, options, on_damaged="skip")
    damage(url, options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = batches(buffer)
    damaged = [w for w in caught if issubclass(w.category, DamagedTrajectoryWarning)]
    assert [str(w.message).split(" from ")[0] for w in damaged] == [
        f"on_damaged='skip' dropped trajectory {TRUNCATED}",
        f"on_damaged='skip' dropped trajectory {DELETED}",
    ]
    assert f"trajectories/{TRUNCATED}/actions" in str(damaged[0].message)
    assert f"{url}/trajectories/{DELETED}" in str(damaged[1].message)
    assert all(f"rbzarr verify --repair --drop-damaged {url}" in str(w.message) for w in damaged)
    assert buffer.get_stats()["damaged_trajectories"] == [TRUNCATED, DELETED]
    assert buffer.trajectory_ids == [0, 2, 4, 5]
    reference = stored_buffer(reference_url, None, skip=(TRUNCATED, DELETED))
    assert got == batches(reference)
    assert {value // 10 for batch in got for value in batch} == {0, 2, 4, 5}
    buffer.close()
    # The store is left as it is: its index still lists every trajectory.
    assert open_buffer(url, options).ids == list(range(COUNT))


def test_default_names_the_damaged_trajectory(tmp_path):
    url = str(tmp_path / "s")
    buffer = stored_buffer(url, None)
    location = Location.from_url(url)
    location.delete("trajectories", str(DELETED))
    with pytest.raises(CorruptStoreError) as caught:
        for _ in range(3):
            buffer.sample(48)
    message = str(caught.value)
    assert message.startswith(f"trajectory {DELETED}: the index of {url} lists it")
    assert f"({url}/trajectories/{DELETED}) is missing" in message
    assert f"`rbzarr verify --repair --drop-damaged {url}`" in message
    assert buffer.get_stats()["damaged_trajectories"] == []
    assert len(buffer) == COUNT


def test_skip_drops_damaged_trajectories_and_keeps_the_draws_locally(tmp_path):
    check_skip(str(tmp_path / "s"), str(tmp_path / "reference"), None)


def test_skip_with_prefetch_hands_out_the_same_batches(tmp_path):
    url = str(tmp_path / "s")
    buffer = stored_buffer(url, None, on_damaged="skip", prefetch=2)
    damage(url, None)
    with pytest.warns(DamagedTrajectoryWarning):
        got = batches(buffer)
    reference = stored_buffer(str(tmp_path / "reference"), None, skip=(TRUNCATED, DELETED))
    assert got == batches(reference)
    buffer.close()


def test_skip_in_sample_sequences_drops_a_trajectory_whose_dones_are_missing(tmp_path):
    url = str(tmp_path / "s")
    buffer = stored_buffer(url, None, on_damaged="skip")
    Location.from_url(url).delete("trajectories", str(DELETED))
    with pytest.warns(DamagedTrajectoryWarning, match=f"trajectory {DELETED}"):
        got = buffer.sample_sequences(8, 2)
    reference = stored_buffer(str(tmp_path / "reference"), None, skip=(DELETED,))
    want = reference.sample_sequences(8, 2)
    assert torch.equal(got["rewards"], want["rewards"])
    assert buffer.get_stats()["damaged_trajectories"] == [DELETED]


def test_skip_drops_a_missing_pt_file(tmp_path):
    url = str(tmp_path / "s")
    buffer = stored_buffer(url, None, on_damaged="skip", trajectory_format="pt")
    next((tmp_path / "s").glob(f"trajectory_{DELETED}_*.pt")).unlink()
    with pytest.warns(DamagedTrajectoryWarning, match=rf"trajectory_{DELETED}_w\.pt not found"):
        got = batches(buffer)
    reference = stored_buffer(str(tmp_path / "reference"), None, skip=(DELETED,))
    assert got == batches(reference)
    assert buffer.get_stats()["damaged_trajectories"] == [DELETED]


def test_a_view_with_skip_drops_them_also_after_refresh_and_pickles_the_policy(tmp_path):
    url = str(tmp_path / "s")
    stored_buffer(url, None).close()
    damage(url, None)
    view = open_buffer(url, seed=3, on_damaged="skip")
    with pytest.warns(DamagedTrajectoryWarning):
        got = batches(view)
    stored_buffer(str(tmp_path / "reference"), None, skip=(TRUNCATED, DELETED)).close()
    reference = open_buffer(tmp_path / "reference", seed=3)
    assert got == batches(reference)
    view.refresh()  # the store's index still lists them: they stay dropped
    assert view.ids == [0, 2, 4, 5] and view.damaged_trajectories == [TRUNCATED, DELETED]
    copy = pickle.loads(pickle.dumps(view))  # as a DataLoader worker opens it
    assert copy.on_damaged == "skip"
    buffer = stored_buffer(str(tmp_path / "t"), None, on_damaged="skip")
    assert store_spec(buffer).on_damaged == "skip"  # what ReplayDataset's workers open


def test_on_damaged_takes_raise_or_skip():
    with pytest.raises(ValueError, match=r"on_damaged must be one of \('raise', 'skip'\)"):
        TrajectoryReplayBuffer(on_damaged="ignore")
    assert TrajectoryReplayBuffer().on_damaged == "raise"


@pytest.mark.s3
def test_skip_on_s3(s3_bucket: str, s3_direct_options: dict[str, Any], tmp_path):
    check_skip(f"s3://{s3_bucket}/s", str(tmp_path / "reference"), s3_direct_options)


def test_the_damage_warning_points_at_the_callers_line(tmp_path):
    url = str(tmp_path / "s")
    buffer = stored_buffer(url, None, on_damaged="skip")
    Location.from_url(url).delete("trajectories", str(DELETED))
    with pytest.warns(DamagedTrajectoryWarning) as caught:
        buffer.sample_sequences(8, 2)
    assert [w.filename for w in caught] == [__file__]
    view = open_buffer(url, on_damaged="skip", seed=0)
    with pytest.warns(DamagedTrajectoryWarning) as caught:
        for _ in range(20):
            view.sample(16)
    assert {w.filename for w in caught} == {__file__}
    # One call deeper inside rbzarr (RLinf's name for sample): still the caller's line.
    again = stored_buffer(str(tmp_path / "again"), None, on_damaged="skip")
    Location.from_url(str(tmp_path / "again")).delete("trajectories", str(DELETED))
    with pytest.warns(DamagedTrajectoryWarning) as caught:
        for _ in range(20):
            again.sample_chunks(16)
    assert {w.filename for w in caught} == {__file__}
