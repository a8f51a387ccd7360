"""ViewBase: the index, sampling and reads of a read-only view of a store.

:class:`~rbzarr.analysis.view.BufferView` builds on it: iteration over trajectories, steps and
episodes, lazy Zarr / dask / xarray access, and pickling.  The view trusts only the index:
it lists the committed trajectories of ``trajectory_index.json`` and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rbzarr.buffer.checkpoint import schema_from_json
from rbzarr.buffer.index import TrajectoryIndex
from rbzarr.buffer.sampler import WindowSampler
from rbzarr.errors import EmptyBufferError
from rbzarr.storage.documents import Documents
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.row_reads import plan_misses, read_batch
from rbzarr.trajectory import tree
from rbzarr.trajectory.model import Schema, Trajectory, validate

__all__ = ["ViewBase"]


class ViewBase:
    """The index, sampling and reads of a read-only view of a store.

    Build views with :func:`~rbzarr.analysis.view.open_buffer`; see
    :class:`~rbzarr.analysis.view.BufferView`.

    Parameters
    ----------
    layout
        The store's layout, opened read-only.
    documents
        Its ``metadata.json`` and ``trajectory_index.json``, as just read.
    seed
        Seed of the view's own sampling generator; ``None`` seeds it nondeterministically.
    sample_window_size
        :meth:`sample` draws from the last ``sample_window_size`` committed trajectories;
        0 or negative means all of them.
    refresh_interval
        Seconds after which :meth:`sample` first re-reads the index (0: before every
        sample); ``None``: only :meth:`refresh` re-reads it.

    Raises
    ------
    ValueError
        ``refresh_interval`` is negative (or NaN).
    CorruptStoreError
        The index is malformed, or of a newer format than this rbzarr knows.
    """

    def __init__(
        self,
        layout: TrajectoryLayout,
        documents: Documents,
        *,
        seed: int | None = None,
        sample_window_size: int = 0,
        refresh_interval: float | None = None,
    ) -> None:
        if refresh_interval is not None and not refresh_interval >= 0:
            raise ValueError(f"refresh_interval must be >= 0 seconds, got {refresh_interval}")
        self.layout = layout
        self.sample_window_size = sample_window_size
        self.refresh_interval = refresh_interval
        self._sampler = WindowSampler(seed)
        self._schema: Schema | None = None
        self._set_documents(documents)

    def _set_documents(self, documents: Documents) -> None:
        self._documents = documents
        self._index = TrajectoryIndex.from_documents(documents, self.url)
        self._read_at = time.monotonic()

    def state_dict(self) -> dict[str, Any]:
        """The view's sampling state: ``{"sampler": ...}`` (seed and generator state).

        Returns
        -------
        dict of str to Any
            ``{"sampler": WindowSampler.state_dict()}``, JSON-ready.
        """
        return {"sampler": self._sampler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`: the next draws continue that stream.

        Parameters
        ----------
        state
            A dict from :meth:`state_dict` (of this view or another one).
        """
        self._sampler.load_state_dict(state["sampler"])

    def __len__(self) -> int:
        return len(self._index)

    @property
    def url(self) -> str:
        """The store's location."""
        return self.layout.location.url

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options the store was opened with (a copy)."""
        return dict(self.layout.location.storage_options)

    @property
    def format(self) -> str:
        """The store's layout: ``"zarr"``, ``"pt"`` or ``"pkl"``."""
        return self.layout.format

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of ``metadata.json``."""
        return dict(self._documents.metadata)

    @property
    def ids(self) -> list[int]:
        """Committed trajectory ids, in the index's (insertion) order."""
        return list(self._index.id_list)

    @property
    def entries(self) -> dict[int, dict[str, Any]]:
        """Index entries by id (copies)."""
        return {i: dict(self._index.entries[i]) for i in self._index.id_list}

    @property
    def total_samples(self) -> int:
        """``T * B`` summed over the committed trajectories."""
        return self._index.total_samples

    def refresh(self) -> None:
        """Re-read the index, picking up trajectories committed since the view was opened."""
        self._set_documents(self.layout.read_documents())

    def sample(
        self, num_chunks: int, *, generator: torch.Generator | None = None
    ) -> dict[str, Any]:
        """Sample ``num_chunks`` committed rows, as ``TrajectoryReplayBuffer.sample`` does.

        The draw is the buffer's (uniform over the window's rows, the same output keys,
        order and dtypes); every row is read from storage.  ``generator`` replaces the
        view's own generator for this call.  With a ``refresh_interval`` the index is
        re-read first when it is older than that.

        Parameters
        ----------
        num_chunks
            Rows to draw (clamped to the window's sample count).
        generator
            A CPU ``torch.Generator`` to draw with instead of the view's own, whose stream
            is then left untouched.

        Returns
        -------
        dict of str to Any
            A nested dict of CPU tensors shaped ``[n, ...]``, as the buffer returns.

        Raises
        ------
        ValueError
            ``num_chunks`` is not positive.
        EmptyBufferError
            The index lists no trajectory.
        """
        if num_chunks <= 0:
            raise ValueError(f"num_chunks must be positive, got {num_chunks}")
        interval = self.refresh_interval
        if interval is not None and time.monotonic() - self._read_at >= interval:
            self.refresh()
        window = self._index.window(self.sample_window_size)
        if not window:
            raise EmptyBufferError(f"{self.url}: no committed trajectory to sample from")
        counts = self._index.sample_counts(window)
        positions, rows = self._sampler.draw(num_chunks, counts, generator)
        ids = torch.tensor(window, dtype=torch.int64)[positions]
        nothing_cached = torch.zeros(len(ids), dtype=torch.bool)
        plan = plan_misses(ids, rows, nothing_cached, {}, self.schema(), self._index.entries, {})
        return tree.unflatten(read_batch(plan, self.layout))

    def schema(self) -> Schema:
        """Sampled keys (in batch order) with their dtype names and trailing shapes.

        From ``metadata.json`` when rbzarr wrote the store, else from its first trajectory.

        Returns
        -------
        Schema
            Flat key to ``(dtype name, trailing shape)``; empty for an empty store without
            a recorded schema.
        """
        if self._schema is None:
            schema = schema_from_json(self._documents.metadata.get("schema"))
            if schema is None and self._index.id_list:
                schema = validate(self.trajectory(self._index.id_list[0])).schema
            if schema is None:
                return {}
            self._schema = schema
        return dict(self._schema)

    def entry(self, trajectory_id: int) -> dict[str, Any]:
        """The index entry of ``trajectory_id``.

        Parameters
        ----------
        trajectory_id
            A committed id.

        Returns
        -------
        dict of str to Any
            RLinf's entry keys (``num_samples``, ``shape``, ...) and rbzarr's ``uuid``; the
            view's own dict, not a copy.

        Raises
        ------
        KeyError
            The index does not list ``trajectory_id``.
        """
        if trajectory_id not in self._index.entries or trajectory_id not in self._index.id_list:
            raise KeyError(f"{self.url}: trajectory {trajectory_id} is not in the index")
        return self._index.entries[trajectory_id]

    def keys(self) -> list[str]:
        """Flat field keys (``"rewards"``, ``"curr_obs/image"``) of the first trajectory.

        Returns
        -------
        list of str
            In the trajectory's field order; empty when the index lists nothing.
        """
        if not self._index.id_list:
            return []
        return self.layout.field_names(self.entry(self._index.id_list[0]))

    def trajectory(self, trajectory_id: int, keys: Sequence[str] | None = None) -> Trajectory:
        """Read one committed trajectory (raw rows), optionally only the flat ``keys``.

        Parameters
        ----------
        trajectory_id
            A committed id.
        keys
            Flat keys to read; ``None`` reads every field.

        Returns
        -------
        Trajectory
            The raw ``[T(+E), B, ...]`` rows, reset rows included.

        Raises
        ------
        KeyError
            The index does not list ``trajectory_id``.
        """
        return self.layout.read(self.entry(trajectory_id), keys)
