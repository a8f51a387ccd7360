"""A trajectory validated once, on ``add_trajectories``, travelling with its spec and flat view."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from rbzarr.trajectory.flat_view import Residue, split_trajectory
from rbzarr.trajectory.model import (
    Schema,
    Trajectory,
    TrajectorySpec,
    as_trajectory,
    trajectory_from_raw,
    validate,
    validated_fields,
)
from rbzarr.trajectory.staging import staging_buffer

__all__ = [
    "GIL_COPY_BYTES",
    "STAGING_TAIL",
    "ValidatedTrajectory",
    "arrays_of",
    "clone_trajectory",
    "rows_to_write",
    "staging_of",
    "tensors_of",
    "tensors_to_write",
]


# Spare bytes after each staged tensor: a writer may put a small trailer there (a shard's
# index), so the tensor and its trailer go to storage as one buffer, not copied again.
STAGING_TAIL = 32
# Tensors smaller than this are cloned, not staged: joining their few bytes again costs less
# than staging them (a tiny trajectory of 3 tensors measured 20 us more to add when staged).
STAGING_MIN_BYTES = 1 << 16


def clone_trajectory(trajectory: Trajectory) -> Trajectory:
    """A :class:`~rbzarr.trajectory.model.Trajectory` owning copies of every tensor."""
    return _staged_clone(trajectory, trajectory.tensors())[0]


# CPU dtypes copied through numpy: fewer calls that may let go of the GIL than torch's (each
# torch method does, and a writer thread taking the GIL then holds it until its next file
# call, while the caller waits).
_NUMPY_DTYPES = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}


# Copies below this size keep the GIL (a memoryview's copy): a copy that lets go of it
# hands it to the writer thread, which keeps it until its next file call.
GIL_COPY_BYTES = 1 << 20
# One ctypes type spans any such tensor's bytes (a new ``c_char * n`` type per size would be
# made on every copy and left to the garbage collector, ctypes caching it weakly).
_SPAN = ctypes.c_char * GIL_COPY_BYTES


def _bytes_of(tensor: torch.Tensor, nbytes: int) -> memoryview | None:
    """The bytes of a contiguous CPU tensor below :data:`GIL_COPY_BYTES`, read in place
    (``tensor.numpy()`` lets go of the GIL), else ``None``."""
    if not 0 < nbytes < GIL_COPY_BYTES or not tensor.is_contiguous():
        return None
    return memoryview(_SPAN.from_address(tensor.data_ptr())).cast("B")[:nbytes]


def _copy_array(into: np.ndarray, source: np.ndarray | memoryview) -> None:
    """Copy ``source`` (an array, or the bytes :func:`_bytes_of` read) into C-contiguous
    ``into``."""
    if isinstance(source, memoryview):
        into.data.cast("B")[:] = source
    else:
        np.copyto(into, source)


def _staged_clone(
    trajectory: Trajectory, tensors: Mapping[str, torch.Tensor]
) -> tuple[Trajectory, dict[str, torch.Tensor], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A copy of ``trajectory`` (whose tensors by key are ``tensors``), its tensors by key,
    the staging buffer of each large CPU tensor's copy (the tensor's bytes, then
    :data:`STAGING_TAIL` spare bytes), and the numpy array of each copy numpy holds."""
    fields: dict[str, torch.Tensor] = {}
    staging: dict[str, np.ndarray] = {}
    arrays: dict[str, np.ndarray] = {}
    for key, given in tensors.items():
        # A tensor that autograd does not track is not detached first (nothing to detach).
        value = given.detach() if given.requires_grad else given
        nbytes = value.numel() * value.element_size()
        plain = value.device.type == "cpu" and value.dtype in _NUMPY_DTYPES
        if not plain and (value.device.type != "cpu" or nbytes < STAGING_MIN_BYTES):
            fields[key] = value.clone()
            continue
        buffer = staging_buffer(nbytes + STAGING_TAIL) if nbytes >= STAGING_MIN_BYTES else None
        if plain:
            source = _bytes_of(value, nbytes)
            dtype = _NUMPY_DTYPES[value.dtype]
            if buffer is None:
                array = np.empty(value.shape, dtype)
            else:
                array = buffer[:nbytes].view(dtype).reshape(value.shape)
            _copy_array(array, value.numpy() if source is None else source)
            fields[key] = torch.from_numpy(array)
            arrays[key] = array
        else:
            assert buffer is not None  # a large CPU tensor of a dtype numpy lacks
            staged = torch.from_numpy(buffer[:nbytes]).view(value.dtype).view(value.shape)
            fields[key] = staged.copy_(value)
        if buffer is not None:
            staging[key] = buffer
    copied = trajectory_from_raw(fields, trajectory.max_episode_length, trajectory.model_weights_id)
    return copied, fields, staging, arrays


@dataclass(frozen=True)
class ValidatedTrajectory:
    """A validated trajectory: raw rows, what validation learnt, and the flat view.

    ``flat`` and ``residue`` share memory with ``trajectory`` and are split off on first use,
    not on ``add_trajectories``: with ``auto_save`` the cache and the writer thread use them
    after the call has returned.
    """

    trajectory: Trajectory
    spec: TrajectorySpec
    # Its tensors by flat key (:meth:`Trajectory.tensors`), flattened once.
    fields: Mapping[str, torch.Tensor]
    # Key to the staging buffer of its copied tensor (copies only; see :data:`STAGING_TAIL`).
    staging: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Key to the numpy array of its copied tensor, where numpy holds the dtype (copies only:
    # the writer encodes them without a torch call).
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)

    @functools.cached_property
    def _split(self) -> tuple[dict[str, torch.Tensor], Residue]:
        return split_trajectory(self.trajectory, self.spec, self.fields)

    @property
    def flat(self) -> dict[str, torch.Tensor]:
        """The ``[T*B, ...]`` rows of every sampled field, in schema order, reset rows dropped."""
        return self._split[0]

    @property
    def residue(self) -> Residue:
        """What :attr:`flat` leaves out (reset rows, unsampled fields, scalars)."""
        return self._split[1]

    def copied(self) -> ValidatedTrajectory:
        """This trajectory owning a copy of every tensor (large ones staged)."""
        trajectory, fields, staging, arrays = _staged_clone(self.trajectory, self.fields)
        return ValidatedTrajectory(trajectory, self.spec, fields, staging, arrays)

    @classmethod
    def check(
        cls, trajectory: object, schema: Schema | None = None, *, copy: bool = False
    ) -> ValidatedTrajectory:
        """Validate ``trajectory`` against ``schema``, optionally copying it first."""
        # RLinf's own Trajectory (or any object with its fields) is read by field name.
        trajectory = as_trajectory(trajectory)
        fields, spec = validated_fields(trajectory, schema)
        # The schema is listed in ``schema``'s order, and the split follows it.
        validated = cls(trajectory, spec, fields)
        return validated.copied() if copy else validated


def arrays_of(trajectory: Trajectory | ValidatedTrajectory) -> Mapping[str, np.ndarray]:
    """The numpy arrays of a validated copy's tensors by key (none for other trajectories)."""
    return trajectory.arrays if isinstance(trajectory, ValidatedTrajectory) else {}


def staging_of(trajectory: Trajectory | ValidatedTrajectory) -> Mapping[str, np.ndarray]:
    """The staging buffers of a validated copy's tensors by key (none for other trajectories)."""
    return trajectory.staging if isinstance(trajectory, ValidatedTrajectory) else {}


def tensors_of(trajectory: Trajectory | ValidatedTrajectory) -> Mapping[str, torch.Tensor]:
    """The raw tensors by key of a trajectory already validated (flattened once for a
    :class:`ValidatedTrajectory`)."""
    if isinstance(trajectory, ValidatedTrajectory):
        return trajectory.fields
    return trajectory.tensors()


def tensors_to_write(trajectory: Trajectory | ValidatedTrajectory) -> Mapping[str, torch.Tensor]:
    """The raw tensors by key a layout writes: a :class:`ValidatedTrajectory`'s as they are
    (validated once, on add), any other trajectory's after validating it."""
    if isinstance(trajectory, ValidatedTrajectory):
        return trajectory.fields
    return validated_fields(trajectory)[0]


def rows_to_write(trajectory: Trajectory | ValidatedTrajectory) -> Trajectory:
    """The raw rows a layout writes: a :class:`ValidatedTrajectory`'s as they are (validated once,
    on add), any other trajectory's after validating it.
    """
    if isinstance(trajectory, ValidatedTrajectory):
        return trajectory.trajectory
    validate(trajectory)
    return trajectory
