"""RLinf's file-per-trajectory layouts: ``trajectory_{id}_{model_weights_id}.pt|.pkl``.

Each file holds a dict of the trajectory's non-None dataclass fields, tensors as raw
``[T(+E), B, ...]`` rows and ``curr_obs`` / ``next_obs`` / ``forward_inputs`` as nested
dicts (empty ones included), exactly as RLinf writes it, so either program reads the other's
directory.  Files are written atomically beside ``metadata.json`` and
``trajectory_index.json``; they are read whole (rows are picked after decoding).

Reading is strict: a file with a top-level field that :class:`~rbzarr.trajectory.model.Trajectory`
does not have is refused with :class:`~rbzarr.errors.CorruptStoreError` naming the fields,
rather than silently dropping data.  Missing fields keep the dataclass defaults.  A global
that the safe readers refuse raises :class:`~rbzarr.errors.UnsafePickleError`.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import re
import reprlib
import struct
import zipfile
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from rbzarr.errors import (
    CheckpointNotFoundError,
    CorruptStoreError,
    InvalidTrajectoryError,
    RbzarrError,
    StoreExistsError,
    UnsafePickleError,
)
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import safe_name
from rbzarr.storage.layout import TrajectoryLayout, field_dtypes
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.storage.rlinf.safe_pickle import safe_load
from rbzarr.trajectory import tree
from rbzarr.trajectory.dtypes import to_numpy
from rbzarr.trajectory.model import Trajectory, trajectory_from_raw, validate
from rbzarr.trajectory.validated import ValidatedTrajectory, rows_to_write

__all__ = ["FileLayout", "PklLayout", "PtLayout"]

_SCALAR_FIELDS = ("max_episode_length", "model_weights_id")
# What torch.load(weights_only=True) raises on a damaged or hostile file.
_TORCH_LOAD_ERRORS = (
    pickle.UnpicklingError,
    RuntimeError,
    EOFError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    OverflowError,
    struct.error,
)
# A trajectory file's dicts nest this deep at most (fields, then ``curr_obs`` and the like,
# then their keys' own dicts), and hold this many values at most.
_MAX_RECORD_DEPTH = 32
_MAX_RECORD_VALUES = 100_000
# Loaded values named in errors: a few levels and characters of each.
_SHORT_REPR = reprlib.Repr()


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU, owning exactly its own bytes."""
    # Pickling a view stores its whole storage, so slices of larger tensors are copied.
    tensor = tensor.detach().cpu()
    owns_storage = (
        tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )
    return tensor if owns_storage else tensor.clone(memory_format=torch.contiguous_format)


def _to_record(trajectory: Trajectory) -> dict[str, Any]:
    """The dict RLinf stores for ``trajectory``: its non-None fields, tensors compacted."""
    record: dict[str, Any] = {}
    for spec in dataclasses.fields(trajectory):
        value = getattr(trajectory, spec.name)
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            value = _compact(value)
        elif isinstance(value, dict):
            value = tree.unflatten(tree.map_flat(lambda _, t: _compact(t), tree.flatten(value)))
        record[spec.name] = value
    return record


class FileLayout(TrajectoryLayout):
    """One file per trajectory at the location's root; subclasses pick the serializer."""

    suffix: ClassVar[str]

    # -- serialization -------------------------------------------------------------------
    @abstractmethod
    def _dumps(self, record: dict[str, Any]) -> bytes:
        """Serialize a trajectory's dict."""

    @abstractmethod
    def _loads(self, data: bytes, source: str) -> Any:
        """Deserialize a file's bytes (``source`` names it in errors)."""

    # -- naming --------------------------------------------------------------------------
    def file_name(self, entry: Entry) -> str:
        """``trajectory_{id}_{model_weights_id}.{suffix}``, refused if it is not a plain name."""
        tid, mwid = int(entry["trajectory_id"]), entry.get("model_weights_id", "")
        name = f"trajectory_{tid}_{mwid}.{self.suffix}"
        return safe_name(name, self.location.url)

    @classmethod
    def name_pattern(cls) -> re.Pattern[str]:
        """What :meth:`file_name` produces; group 1 is the trajectory id."""
        return re.compile(rf"trajectory_(0|[1-9][0-9]*)_.*\.{re.escape(cls.suffix)}", re.DOTALL)

    # -- TrajectoryLayout ----------------------------------------------------------------
    def trajectory_path(self, entry: Entry) -> tuple[str, ...]:
        # docstring inherited
        return (self.file_name(entry),)

    def write(self, entry: Entry, trajectory: Trajectory | ValidatedTrajectory) -> None:
        """Write the trajectory's non-None fields as one file, atomically (and synced with
        its directory when the location is ``durable``)."""
        name = self.file_name(entry)
        trajectory = rows_to_write(trajectory)
        self.location.write_bytes(self._dumps(_to_record(trajectory)), name)

    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        """Load the whole file; the scalar fields it lacks come from the entry."""
        _, trajectory = self._load(entry, keys)
        return trajectory

    def first_row(
        self, entry: Entry, keys: Sequence[str]
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        # docstring inherited
        trajectory = self.read(entry)  # decoded once for both
        rows = self._rows_of(entry, trajectory, torch.zeros(1, dtype=torch.int64), keys)
        return {key: to_numpy(row) for key, row in rows.items()}, field_dtypes(trajectory)

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target``: into a layout of this format, the file's bytes
        once they have loaded here as a trajectory (the safe loaders and every check of
        :meth:`read`), so nothing unchecked reaches ``target``; else read and written again."""
        if type(target) is not type(self):
            super().copy_to(target, entry)
            return
        name = self.file_name(entry)
        if target.location.exists(name):
            raise StoreExistsError(
                f"{target.location.url}/{name} already exists; a copy never overwrites data"
            )
        data, _ = self._load(entry)
        target.location.write_bytes(data, name)

    def _load(self, entry: Entry, keys: Sequence[str] | None = None) -> tuple[bytes, Trajectory]:
        """The file's bytes and the trajectory they hold, checked."""
        name = self.file_name(entry)
        source = f"{self.location.url}/{name}"
        try:
            data = self.location.read_bytes(name)
        except FileNotFoundError as exc:
            raise CheckpointNotFoundError(
                f"trajectory {entry['trajectory_id']}: data file {source} not found; run "
                f"`rbzarr verify --repair --drop-damaged {self.location.url}` to drop it from "
                "the index"
            ) from exc
        record = self._loads(data, source)
        if not isinstance(record, dict):
            raise CorruptStoreError(
                f"{source}: expected a dict of trajectory fields, got {type(record).__name__}"
            )
        return data, _trajectory_from_record(record, entry, keys, source)

    def delete(self, entry: Entry) -> None:
        # docstring inherited
        self.location.delete(self.file_name(entry))

    def _stored_paths(self) -> dict[str, int]:
        """Every file at the root named like a trajectory file of this format."""
        pattern = self.name_pattern()
        matches = (pattern.fullmatch(name) for name in self.location.list_names())
        return {match.group(0): int(match.group(1)) for match in matches if match}

    def _foreign_files(self, path: str) -> list[str]:
        """``[path]`` unless the file loads as a trajectory dict (else it is the user's)."""
        source = f"{self.location.url}/{path}"
        try:
            record = self._loads(self.location.read_bytes(path), source)
        except (RbzarrError, OSError):
            return [path]
        return [] if isinstance(record, dict) else [path]

    def list_ids(self) -> list[int]:
        # docstring inherited
        return sorted(set(self._stored_paths().values()))


def _trajectory_from_record(
    record: dict[str, Any], entry: Entry, keys: Sequence[str] | None, source: str
) -> Trajectory:
    """The trajectory (only ``keys``, if given) a loaded dict holds, or CorruptStoreError."""
    _check_record_size(record, source)
    scalars = {name: record.pop(name, entry.get(name)) for name in _SCALAR_FIELDS}
    mel, mwid = scalars["max_episode_length"], scalars["model_weights_id"]
    if not isinstance(mel, int) or isinstance(mel, bool) or not isinstance(mwid, str):
        raise CorruptStoreError(
            f"{source}: expected an int max_episode_length and a str model_weights_id, "
            f"got {_bounded_repr(mel)} and {_bounded_repr(mwid)}"
        )
    try:
        fields = tree.flatten(record)
    except ValueError as exc:
        raise CorruptStoreError(f"{source}: {exc}") from exc
    for path, value in fields.items():
        if not isinstance(value, torch.Tensor):
            raise CorruptStoreError(
                f"{source}: field {path!r}: expected a torch.Tensor, got {type(value).__name__}"
            )
        _check_tensor(value, f"{source}: field {path!r}")
    if keys is not None:
        missing = [key for key in keys if key not in fields]
        if missing:
            raise CorruptStoreError(f"{source}: fields {missing} missing; it has {list(fields)}")
        fields = {key: fields[key] for key in keys}
    try:
        trajectory = trajectory_from_raw(fields, mel, mwid)
        shape = list(validate(trajectory).shape) if keys is None else None
    except InvalidTrajectoryError as exc:
        raise CorruptStoreError(f"{source}: {exc}") from exc
    if shape is not None and "shape" in entry and shape != list(entry["shape"]):
        raise CorruptStoreError(
            f"{source}: holds a trajectory of shape {shape}, but the index entry of trajectory "
            f"{entry['trajectory_id']} says {list(entry['shape'])}"
        )
    return trajectory


def _bounded_repr(value: Any) -> str:
    """``repr`` of a loaded value, cut short (a value nested 50 000 deep or a huge int
    prints in a few characters)."""
    try:
        return _SHORT_REPR.repr(value)
    except ValueError:  # an int past Python's limit of digits to print
        return f"a {type(value).__name__}"


def _check_record_size(record: dict[str, Any], source: str) -> None:
    """Refuse a loaded dict nesting deeper or holding more values than a trajectory's can."""
    stack: list[tuple[Any, int]] = [(record, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > _MAX_RECORD_DEPTH or seen > _MAX_RECORD_VALUES:
            raise CorruptStoreError(
                f"{source}: nested deeper than {_MAX_RECORD_DEPTH} dicts or holding more than "
                f"{_MAX_RECORD_VALUES} values: not a trajectory file"
            )
        if isinstance(value, dict):
            stack.extend((child, depth + 1) for child in value.values())


def _check_tensor(tensor: torch.Tensor, where: str) -> None:
    """Refuse a tensor viewing its storage with zero strides or overlapping elements."""
    dims, steps = tensor.shape, tensor.stride()
    if tensor.numel() == 0:
        return
    held = tensor.untyped_storage().nbytes() // tensor.element_size()
    if any(s <= 0 and d > 1 for d, s in zip(dims, steps, strict=True)) or tensor.numel() > held:
        raise CorruptStoreError(
            f"{where}: a tensor view of size {list(dims)}, stride {list(steps)} over a storage "
            f"of {held} elements (zero strides or overlapping elements): not written by rbzarr "
            "or RLinf"
        )


def _check_torch_archive(data: bytes, source: str) -> None:
    """Refuse a ``.pt`` that is not a zip archive of stored records lying inside the file.

    ``torch.save`` stores every record uncompressed; a compressed one (which could inflate far
    past the file's size) or one claiming more bytes than the file holds is refused before
    torch reads it.
    """
    # NotImplementedError: a record "needs" a zip version or feature zipfile lacks.
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise CorruptStoreError(
            f"{source}: not a torch.save zip archive ({exc}); rbzarr and RLinf write those"
        ) from exc
    total = 0
    for record in records:
        total += record.file_size
        if (
            record.compress_type != zipfile.ZIP_STORED
            or record.file_size != record.compress_size
            or record.header_offset + record.compress_size > len(data)
            or total > len(data)
        ):
            raise CorruptStoreError(
                f"{source}: zip record {record.filename!r} is compressed or claims "
                f"{record.file_size} bytes, more than the file's {len(data)}: torch.save "
                "writes stored records inside the file"
            )


class PtLayout(FileLayout):
    """RLinf's ``pt`` layout: ``torch.save`` files, read with ``weights_only=True``."""

    format = "pt"
    suffix = "pt"
    _codec_name = "torch.save"

    def _dumps(self, record: dict[str, Any]) -> bytes:
        # docstring inherited
        buffer = io.BytesIO()
        torch.save(record, buffer)
        return buffer.getvalue()

    def _loads(self, data: bytes, source: str) -> Any:
        # docstring inherited
        _check_torch_archive(data, source)
        try:
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except _TORCH_LOAD_ERRORS as exc:
            # torch reports a refused global and a damaged file with the same class; its
            # weights-only unpickler meets malformed opcodes with lookup and type errors.
            refused = "unsupported global" in str(exc).lower()
            kind = UnsafePickleError if refused else CorruptStoreError
            raise kind(f"{source}: torch.load(weights_only=True) failed: {exc}") from exc


class PklLayout(FileLayout):
    """RLinf's ``pkl`` layout: ``pickle`` files, read with the restricted unpickler.

    ``allow_unsafe_pickle`` reads with plain :mod:`pickle` (which can run arbitrary code):
    only for trusted files.
    """

    format = "pkl"
    suffix = "pkl"

    def __init__(self, location: Location, *, allow_unsafe_pickle: bool = False) -> None:
        super().__init__(location)
        self.allow_unsafe_pickle = allow_unsafe_pickle

    def _dumps(self, record: dict[str, Any]) -> bytes:
        # docstring inherited
        return pickle.dumps(record)

    def _loads(self, data: bytes, source: str) -> Any:
        # docstring inherited
        return safe_load(data, allow_unsafe=self.allow_unsafe_pickle, source=source)
