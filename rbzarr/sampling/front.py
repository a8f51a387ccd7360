"""``sample`` and ``sample_sequences`` as users call them: one definition for buffer and view."""

from __future__ import annotations

from typing import Any, Literal, overload

import torch

from rbzarr.sampling.reader import StoreReader

__all__ = ["SamplingFront"]


class SamplingFront:
    """The public sampling calls of a class that samples through a :class:`StoreReader`."""

    _reader: StoreReader  # set by the subclass

    def _sampling_reader(self) -> StoreReader:
        """The reader to draw from (a subclass may refresh its window first)."""
        raise NotImplementedError

    @property
    def sample_window_size(self) -> int:
        """Sampling draws from this many most recent trajectories (0 or negative: all)."""
        return self._reader.window_size

    @sample_window_size.setter
    def sample_window_size(self, size: int) -> None:
        self._reader.window_size = size
        # Trajectories back in a grown window take their stored priorities, not the max.
        self._reader.fetch_returning()

    @overload
    def sample(
        self,
        num_chunks: int,
        *,
        generator: torch.Generator | None = ...,
        return_info: Literal[False] = ...,
    ) -> dict[str, Any]: ...

    @overload
    def sample(
        self,
        num_chunks: int,
        *,
        generator: torch.Generator | None = ...,
        return_info: Literal[True],
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]: ...

    def sample(
        self,
        num_chunks: int,
        *,
        generator: torch.Generator | None = None,
        return_info: bool = False,
    ) -> dict[str, Any] | tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Sample ``num_chunks`` rows from the window: uniformly, or by priority.

        The draw is RLinf's ``TrajectoryReplayBuffer.sample`` (the same output keys, order
        and dtypes).  A :class:`~rbzarr.BufferView` reads every row from storage and, with a
        ``refresh_interval``, first re-reads the index when it is older than that.

        Parameters
        ----------
        num_chunks
            Rows to draw (clamped to the window's sample count; with ``prioritized``
            drawn with replacement, never clamped).
        generator
            A CPU ``torch.Generator`` to draw with for this call instead of the buffer's
            (or view's) own, whose stream is then left untouched (one stream per DataLoader
            worker or rank).  ``None`` draws from the seeded generator: RLinf's stream.
        return_info
            Also return, per row, ``{"index": int64 [n], "weight": float32 [n]}``: its
            global index (``trajectory_id * 2**32 + flat_row``, what ``update_priority``
            takes) and its importance weight (1 without ``prioritized``).  Such a call is
            never served from the batches drawn ahead.

        Notes
        -----
        With the buffer's ``prefetch=N``, a call with ``generator=None`` hands out the next
        batch drawn ahead and draws the ``N`` after it, whose reads run on threads while the
        caller trains.  The batches are exactly those of the same calls without prefetch:
        adding trajectories, loading a checkpoint, ``clear``, another ``num_chunks`` or a
        moved ``generator`` discard the batches drawn ahead.  ``generator`` (and so a
        checkpoint) is always as of the batches handed out.  Up to ``N`` batches are held in
        memory; a read that failed is raised by the call that hands its batch out.

        Returns
        -------
        dict or (dict, dict)
            A nested dict of fresh CPU tensors shaped ``[n, ...]``; with ``return_info``,
            it and the info dict.

        Raises
        ------
        ValueError
            ``num_chunks`` is not positive.
        TypeError
            ``num_chunks`` is not an int (``2.5``, ``True``).
        EmptyBufferError
            The window holds no trajectory (a ``RuntimeError``).
        """
        reader = self._sampling_reader()
        if return_info:
            return reader.sample_with_info(num_chunks, generator)
        return reader.sample(num_chunks, generator)

    @overload
    def sample_sequences(
        self,
        n: int,
        length: int,
        *,
        generator: torch.Generator | None = ...,
        strict_length: bool = ...,
        return_info: Literal[False] = ...,
    ) -> dict[str, Any]: ...

    @overload
    def sample_sequences(
        self,
        n: int,
        length: int,
        *,
        generator: torch.Generator | None = ...,
        strict_length: bool = ...,
        return_info: Literal[True],
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]: ...

    def sample_sequences(
        self,
        n: int,
        length: int,
        *,
        generator: torch.Generator | None = None,
        strict_length: bool = False,
        return_info: bool = False,
    ) -> dict[str, Any] | tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Sample ``n`` sequences of ``length`` consecutive steps, each inside one episode.

        A sequence follows one environment column from a start step drawn uniformly over
        the window's steps (with ``prioritized``: by the priority of its row), into the
        next trajectory where the episode continues there
        (the next id, the same ``B``).  Steps after the episode's end (or after the last
        step stored) are padding: they repeat the last real step, with ``mask`` False.
        The buffer reads rows from its cache, its pending writes or the store (only the
        rows needed; each trajectory's ``dones`` is read once to find its episode ends); a
        :class:`~rbzarr.BufferView` reads every row from storage.

        Parameters
        ----------
        n
            Sequences to draw (not clamped: starts are drawn with replacement).
        length
            Steps per sequence.
        generator
            A CPU ``torch.Generator`` to draw with instead of the sequence stream (seeded
            from ``seed``, separate from :meth:`sample`'s and saved in checkpoints), which
            is then left untouched.
        strict_length
            Draw only starts with ``length`` steps of their episode ahead: no padding.
        return_info
            Also return, per sequence, the global index and importance weight of its
            *start* row (``{"index": [n], "weight": [n]}``, as :meth:`sample`'s).

        Returns
        -------
        dict or (dict, dict)
            The keys of :meth:`sample`, each ``[n, length, ...]``, plus ``"mask"``: bool
            ``[n, length]``, True for the steps of the first step's episode; with
            ``return_info``, it and the info dict.

        Raises
        ------
        ValueError
            ``n`` or ``length`` is not positive, or the trajectories have no ``dones``.
        EmptyBufferError
            The window holds no trajectory, or with ``strict_length`` no episode is that long.
        """
        drawn = self._sampling_reader().sequences_with_info(n, length, generator, strict_length)
        return drawn if return_info else drawn[0]
