"""A ``ray.data`` datasource that reads an rbzarr store (Ray's ``read_zarr`` refuses zarr 3).

Each row is one flat sample (step ``t``, environment ``b`` of one trajectory): the columns
are ``trajectory_id``, ``row`` (``t * B + b``) and every sampled flat key (``rewards``,
``curr_obs/image``, ...), tensors of more than one dimension as Ray's tensor columns.
bfloat16 fields arrive as their ``uint16`` bit patterns.  Trajectories are spread over read
tasks in index order (the union of every writer's); a read task opens the store itself,
so nothing but the URL travels to the workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from ray.data import Dataset, read_datasource
from ray.data.block import Block, BlockAccessor, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from rbzarr.analysis.view import open_buffer
from rbzarr.shared_doc import shared_doc
from rbzarr.storage.index.trajectory_index import share_bounds
from rbzarr.trajectory.dtypes import to_numpy
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate

__all__ = ["StoreDatasource", "read_store"]

_STORE_PARAMETERS = """
url
    The store's path or URL.
storage_options
    fsspec options for ``url``.
keys
    Flat keys to read (all sampled keys by default).
"""


@shared_doc(store_parameters=_STORE_PARAMETERS)
class StoreDatasource(Datasource):
    """The committed trajectories of one store, as rows of flat samples.

    Parameters
    ----------
    {store_parameters}
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        keys: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self.storage_options = dict(storage_options or {})
        view = open_buffer(url, self.storage_options)
        self.keys = list(keys) if keys is not None else None
        self._entries = [view.entries[i] for i in view.ids]
        self._row_bytes = _row_bytes(view.schema(), self.keys)

    def estimate_inmemory_data_size(self) -> int | None:
        # docstring inherited
        return sum(int(e["num_samples"]) for e in self._entries) * self._row_bytes

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        # docstring inherited
        del data_context
        tasks = []
        count = len(self._entries)
        tasks_wanted = max(1, min(parallelism, count))
        for rank in range(tasks_wanted if count else 0):
            start, end = share_bounds(count, rank, tasks_wanted)
            share = self._entries[start:end]
            rows = sum(int(e["num_samples"]) for e in share)
            ids = [int(e["trajectory_id"]) for e in share]
            metadata = BlockMetadata(
                num_rows=rows, size_bytes=rows * self._row_bytes, input_files=None, exec_stats=None
            )
            tasks.append(
                ReadTask(
                    _reader(self.url, self.storage_options, self.keys, ids),
                    metadata,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def _row_bytes(schema: Mapping[str, Any], keys: Sequence[str] | None) -> int:
    """Bytes of one flat sample of ``keys`` (all of them by default)."""
    total = 8 + 8
    for key, (dtype, trailing) in schema.items():
        if keys is None or key in keys:
            itemsize = np.dtype("uint16" if dtype == "bfloat16" else dtype).itemsize
            total += itemsize * int(np.prod(trailing, dtype=np.int64))
    return total


def _reader(
    url: str, options: Mapping[str, Any], keys: Sequence[str] | None, ids: list[int]
) -> Any:
    """The read function of one task: one block per trajectory."""

    def read() -> Iterable[Block]:
        view = open_buffer(url, options)
        for trajectory_id in ids:
            trajectory = view.trajectory(trajectory_id)
            flat = flatten_trajectory(trajectory, validate(trajectory))
            count = next(iter(flat.values())).shape[0]
            batch: dict[str, np.ndarray] = {
                "trajectory_id": np.full(count, trajectory_id, dtype=np.int64),
                "row": np.arange(count, dtype=np.int64),
            }
            for key, rows in flat.items():
                if keys is None or key in keys:
                    batch[key] = to_numpy(rows)
            yield BlockAccessor.batch_to_block(batch)

    return read


@shared_doc(store_parameters=_STORE_PARAMETERS)
def read_store(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    keys: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
) -> Dataset:
    """A ``ray.data`` dataset of the store's flat samples (see the module docs).

    Parameters
    ----------
    {store_parameters}
    override_num_blocks
        Read tasks to use (Ray picks by default).

    Returns
    -------
    ray.data.Dataset
        One row per flat sample.
    """
    return read_datasource(
        StoreDatasource(url, storage_options, keys), override_num_blocks=override_num_blocks
    )
