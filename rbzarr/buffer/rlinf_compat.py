"""RLinf's names on rbzarr's buffer: the calls RLinf's workers and toolkits make.

:class:`RLinfCompatMixin` gives :class:`~rbzarr.TrajectoryReplayBuffer` the methods and
attributes of RLinf's ``TrajectoryReplayBuffer`` that rbzarr's own API names differently,
with RLinf's argument names and results.  Some look private (``_trajectory_id_list``,
``_load_trajectory``, ...) because RLinf's code reaches for them; here they are documented,
supported compatibility names, built on the buffer's public API.  Those that expose state
are read-only and return copies: changing them never changes the buffer.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from rbzarr.shared_doc import shared_doc
from rbzarr.trajectory import tree
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import Trajectory, validate

__all__ = ["RLinfCompatMixin"]

# The parameter section several calls share (see :func:`~rbzarr.shared_doc.shared_doc`).
_MIN_SIZE_PARAMETER = """
Parameters
----------
min_size
    The number of trajectories wanted.
"""


class _Buffer(Protocol):
    """The public buffer API the mixin is built on."""

    def __len__(self) -> int: ...

    def sample(self, num_chunks: int) -> dict[str, Any]: ...

    def release_cache(self) -> None: ...

    def trajectory(self, trajectory_id: int) -> Trajectory: ...

    @property
    def trajectory_ids(self) -> list[int]: ...

    @property
    def index_entries(self) -> dict[int, dict[str, Any]]: ...

    @property
    def generator(self) -> torch.Generator: ...

    @property
    def store_url(self) -> str | None: ...


class RLinfCompatMixin:
    """RLinf's ``TrajectoryReplayBuffer`` calls, on top of the buffer's public API."""

    @shared_doc(min_size_parameter=_MIN_SIZE_PARAMETER)
    def is_ready(self: _Buffer, min_size: int) -> bool:
        """Whether at least ``min_size`` trajectories are in the buffer (RLinf counts them).

        {min_size_parameter}

        Returns
        -------
        bool
            ``len(buffer) >= min_size``.
        """
        return len(self) >= min_size

    @shared_doc(min_size_parameter=_MIN_SIZE_PARAMETER)
    async def is_ready_async(self: _Buffer, min_size: int) -> bool:
        """:meth:`is_ready` as a coroutine, for RLinf's async workers (``await ...``).

        {min_size_parameter}

        Returns
        -------
        bool
            ``len(buffer) >= min_size``, once awaited.
        """
        return len(self) >= min_size

    def sample_chunks(self: _Buffer, num_chunks: int) -> dict[str, Any]:
        """:meth:`sample` under RLinf's other name: ``num_chunks`` rows of the window.

        Parameters
        ----------
        num_chunks
            How many rows to draw (clamped to the window's total samples).

        Returns
        -------
        dict of str to Any
            The batch :meth:`sample` returns: RLinf's nested dict of ``[n, ...]`` tensors.

        Raises
        ------
        ValueError
            ``num_chunks`` is not positive.
        EmptyBufferError
            The buffer holds no trajectory.
        """
        return self.sample(num_chunks)

    def clear_cache(self: _Buffer) -> None:
        """Empty the trajectory cache; the buffer stays open and keeps every trajectory.

        With ``auto_save``, later samples read the released trajectories from storage.
        Without it the cache is the storage, so the buffer is emptied as by ``clear()``
        (RLinf also shuts its writer down here and, without ``auto_save``, keeps an index of
        trajectories whose data it dropped).
        """
        self.release_cache()

    @property
    def auto_save_path(self: _Buffer) -> str | None:
        """The auto-save store's path or URL; ``None`` without ``auto_save``, as in RLinf."""
        return self.store_url

    @property
    def random_generator(self: _Buffer) -> torch.Generator:
        """The ``torch.Generator`` sampling draws from (RLinf's name for it)."""
        return self.generator

    @property
    def _trajectory_id_list(self: _Buffer) -> list[int]:
        """Compatibility name: the ids in the index, oldest first (a copy)."""
        return self.trajectory_ids

    @property
    def _trajectory_index(self: _Buffer) -> dict[int, dict[str, Any]]:
        """Compatibility name: ``{id: entry}`` with RLinf's entry keys (copies).

        Each entry holds ``num_samples``, ``trajectory_id``, ``max_episode_length``,
        ``shape`` and ``model_weights_id``, and rbzarr's ``uuid``.
        """
        return self.index_entries

    def _load_trajectory(self: _Buffer, trajectory_id: int, model_weights_id: str) -> Trajectory:
        """Compatibility name: the raw ``[T, B, ...]`` trajectory ``trajectory_id``.

        Parameters
        ----------
        trajectory_id
            An id of the index.
        model_weights_id
            Its ``model_weights_id`` (RLinf builds the file name from it).

        Raises
        ------
        ValueError
            If ``trajectory_id`` is not in the index, as RLinf.
        FileNotFoundError
            If ``model_weights_id`` is not the trajectory's (RLinf finds no such file).
        """
        entry = self.index_entries.get(trajectory_id)
        if entry is None:
            raise ValueError(f"Trajectory {trajectory_id} not found in index")
        if entry["model_weights_id"] != model_weights_id:
            raise FileNotFoundError(
                f"trajectory {trajectory_id} has model_weights_id "
                f"{entry['model_weights_id']!r}, not {model_weights_id!r}"
            )
        return self.trajectory(trajectory_id)

    @staticmethod
    def _flatten_trajectory(trajectory: object) -> dict[str, Any]:
        """Compatibility name: the flat ``[T*B, ...]`` view of a trajectory, as RLinf nests it.

        Top-level tensor fields of two or more dimensions come first in dataclass order
        (reset rows of ``dones``, ``terminations``, ``truncations`` dropped), then the
        ``curr_obs``, ``next_obs`` and ``forward_inputs`` dicts.  The buffer is not changed.

        Raises
        ------
        InvalidTrajectoryError
            If ``trajectory`` does not validate.
        """
        return tree.unflatten(flatten_trajectory(trajectory, validate(trajectory)))
