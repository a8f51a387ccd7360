"""A trajectory is validated once, on add; the validated form travels to the layouts."""

from __future__ import annotations

import pytest
import torch
from conftest import make_trajectory

from rbzarr import InvalidTrajectoryError
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.trajectory.validated import ValidatedTrajectory, rows_to_write, tensors_to_write


def entry_of(validated: ValidatedTrajectory) -> dict:
    return {
        "trajectory_id": 0,
        "model_weights_id": validated.trajectory.model_weights_id,
        "max_episode_length": validated.trajectory.max_episode_length,
        "shape": list(validated.spec.shape),
        "num_samples": validated.spec.T * validated.spec.B,
    }


def test_rows_to_write_takes_a_validated_trajectorys_rows_as_they_are():
    validated = ValidatedTrajectory.check(make_trajectory(3, 2, 0))
    assert rows_to_write(validated) is validated.trajectory
    raw = make_trajectory(3, 2, 0)
    assert rows_to_write(raw) is raw
    raw.actions = torch.zeros(4, 2, 2, dtype=torch.int64)
    with pytest.raises(InvalidTrajectoryError, match="actions"):
        rows_to_write(raw)


def test_tensors_to_write_are_flattened_once_per_validated_trajectory():
    validated = ValidatedTrajectory.check(make_trajectory(3, 2, 0))
    assert tensors_to_write(validated) is validated.fields
    assert validated.fields.keys() == validated.trajectory.tensors().keys()
    copied = validated.copied()
    assert tensors_to_write(copied) is copied.fields
    for key, value in copied.trajectory.tensors().items():
        assert copied.fields[key] is value  # the copy's own tensors, not the caller's
        assert torch.equal(value, validated.fields[key])
        assert value.data_ptr() != validated.fields[key].data_ptr()
    raw = make_trajectory(3, 2, 0)
    assert tensors_to_write(raw).keys() == raw.tensors().keys()
    raw.actions = torch.zeros(4, 2, 2, dtype=torch.int64)
    with pytest.raises(InvalidTrajectoryError, match="actions"):
        tensors_to_write(raw)


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_layouts_write_the_validated_form_and_still_refuse_a_bad_raw_one(tmp_path, fmt):
    layout = layout_class(fmt)(Location.from_url(tmp_path / "s"))
    validated = ValidatedTrajectory.check(make_trajectory(3, 2, 0))
    entry = entry_of(validated)
    layout.write(entry, validated)
    assert layout.read(entry) == validated.trajectory
    bad = make_trajectory(3, 2, 0)
    bad.actions = torch.zeros(4, 2, 2, dtype=torch.int64)
    with pytest.raises(InvalidTrajectoryError, match="actions"):
        layout.write({**entry, "trajectory_id": 1}, bad)
    assert layout.list_ids() == [0]
