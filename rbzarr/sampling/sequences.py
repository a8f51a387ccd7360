"""Sequence sampling: runs of consecutive steps of one environment inside one episode.

A sequence starts at a step ``(t, b)`` of a trajectory in the window and follows column
``b`` forward in time.  Where the trajectory ends and the next one of the window continues
it (:func:`rbzarr.trajectory.steps.continues`: the next id, the same ``B``), the sequence
goes on in that trajectory.  It stops after the step whose ``dones`` is set, or at the end
of the data; the steps after that are *padding*: they repeat the last real step and their
``mask`` is False, so they cost no extra read.

Which steps end an episode is learnt once per trajectory from its ``dones`` rows
(:class:`EpisodeEnds`); :class:`SequenceSampler` then draws start steps uniformly over the
valid ones and returns, like :class:`~rbzarr.sampling.window.WindowSampler`, window
positions and flat rows only: pure torch, no I/O (both are a
:class:`~rbzarr.sampling.sampler.Sampler`).  The reader reads those rows as it reads
``sample()``'s.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from rbzarr.errors import EmptyBufferError
from rbzarr.sampling.priorities import WindowPriorities, global_index
from rbzarr.sampling.sampler import Window
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory import tree
from rbzarr.trajectory.model import Schema
from rbzarr.trajectory.steps import DONES, continues, episode_ends

__all__ = [
    "MASK",
    "EpisodeEnds",
    "SequenceDraw",
    "SequenceSampler",
    "SequencesOf",
    "check_sequence_request",
]

MASK = "mask"

# A trajectory's identity for memos: ids restart after clear() without auto_save, uuids never.
Key = tuple[int, str]


def trajectory_key(entry: Mapping[str, Any]) -> Key:
    """The memo key of an index entry: its id and uuid."""
    return int(entry["trajectory_id"]), str(entry.get("uuid", ""))


def check_sequence_request(n: int, length: int, schema: Schema | None) -> None:
    """Refuse a non-positive ``n`` or ``length``, or a schema without ``dones``.

    Raises
    ------
    ValueError
        ``n`` or ``length`` is not positive, or the trajectories have no ``dones`` field.
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    if schema is not None and DONES not in schema:
        raise ValueError(
            f"sample_sequences needs a {DONES!r} field to find episode ends; the trajectories "
            f"have {list(schema)}"
        )


class EpisodeEnds:
    """Which steps end an episode, ``[T, B]`` bool per trajectory, learnt once each."""

    def __init__(self) -> None:
        self._ended: dict[Key, torch.Tensor] = {}

    def unknown(self, entries: Sequence[Entry]) -> list[Entry]:
        """Those of ``entries`` whose ends are not learnt yet."""
        return [e for e in entries if trajectory_key(e) not in self._ended]

    def learn(self, entry: Entry, dones: torch.Tensor) -> None:
        """Record a trajectory's ends from ``dones`` (``[T*B, ...]`` or ``[T, B, ...]``)."""
        T, B = int(entry["shape"][0]), int(entry["shape"][1])
        self._ended[trajectory_key(entry)] = episode_ends(dones, T, B)

    def ended(self, entry: Entry) -> torch.Tensor:
        """The ``[T, B]`` ends of a learnt trajectory."""
        return self._ended[trajectory_key(entry)]

    def keep_only(self, entries: Sequence[Entry]) -> None:
        """Forget every trajectory but ``entries`` (the window)."""
        keep = {trajectory_key(e) for e in entries}
        for key in [k for k in self._ended if k not in keep]:
            del self._ended[key]


@dataclass(frozen=True)
class _WindowSteps:
    """The window laid out on one time axis: where rows and steps of each trajectory start."""

    row_starts: torch.Tensor  # [P] first global flat row of each trajectory
    row_ends: torch.Tensor  # [P]
    time_starts: torch.Tensor  # [P] first global time step
    time_ends: torch.Tensor  # [P]
    widths: torch.Tensor  # [P] B of each trajectory
    remaining: torch.Tensor  # [rows] steps from each row to its episode's end (or run's end)


def _window_steps(entries: Sequence[Entry], ends: EpisodeEnds) -> _WindowSteps:
    """Lay out the window and count, per step, the steps left in its episode."""
    T = torch.tensor([int(e["shape"][0]) for e in entries], dtype=torch.int64)
    B = torch.tensor([int(e["shape"][1]) for e in entries], dtype=torch.int64)
    rows = T * B
    remaining: list[torch.Tensor] = []
    run: list[torch.Tensor] = []
    for position, entry in enumerate(entries):
        run.append(ends.ended(entry))
        last = position + 1 == len(entries) or not continues(entry, entries[position + 1])
        if last:
            remaining.extend(_remaining_in_run(run))
            run = []
    return _WindowSteps(
        row_starts=torch.cumsum(rows, 0) - rows,
        row_ends=torch.cumsum(rows, 0),
        time_starts=torch.cumsum(T, 0) - T,
        time_ends=torch.cumsum(T, 0),
        widths=B,
        remaining=torch.cat(remaining),
    )


def _remaining_in_run(run: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per trajectory of a run (``[T, B]`` ends each): steps to the episode's end, flat rows."""
    ended = torch.cat(run).clone()
    steps = int(ended.shape[0])
    ended[-1] = True  # the data ends here: nothing after it belongs to any episode yet
    time = torch.arange(steps, dtype=torch.int64).unsqueeze(1)
    end_at = torch.where(ended, time, torch.full_like(time, steps))
    next_end = end_at.flip(0).cummin(dim=0).values.flip(0)
    remaining = next_end - time + 1
    return [part.reshape(-1) for part in remaining.split([int(e.shape[0]) for e in run])]


@dataclass(frozen=True)
class SequenceDraw:
    """``n`` sequences of ``length`` steps: window positions, flat rows and the mask."""

    positions: torch.Tensor  # [n * length] position in the window of each step's trajectory
    rows: torch.Tensor  # [n * length] flat row of each step
    mask: torch.Tensor  # [n, length] True for the steps of the first step's episode
    weights: torch.Tensor | None = None  # [n] importance weights (None: uniform starts)

    def info(self, window_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each sequence's start row's global index and importance weight (float32)."""
        n, length = self.mask.shape
        first = torch.arange(n) * length
        weights = self.weights
        if weights is None:
            weights = torch.ones(n, dtype=torch.float32)
        index = global_index(window_ids[self.positions[first]], self.rows[first])
        return {"index": index, "weight": weights}

    def batch(self, flat: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The nested ``[n, length, ...]`` batch of the rows read for this draw, with ``mask``."""
        n, length = self.mask.shape
        shaped = {key: rows.view(n, length, *rows.shape[1:]) for key, rows in flat.items()}
        return {**tree.unflatten(shaped), MASK: self.mask}


class SequenceSampler:
    """Draws sequence starts uniformly over a window's valid steps; owns their own stream.

    The stream is separate from :class:`~rbzarr.sampling.window.WindowSampler`'s, so
    sampling sequences leaves the RLinf stream of ``sample()`` as it was.  The
    :class:`~rbzarr.sampling.sampler.Sampler` of one request is :meth:`of_length`.
    """

    def __init__(self, seed: int | None, priorities: WindowPriorities | None = None) -> None:
        self.priorities = priorities
        self.ends = EpisodeEnds()
        self.generator = torch.Generator()
        self._seed(seed)
        self._memo: tuple[tuple[Key, ...], _WindowSteps] | None = None
        self._strict_memo: dict[int, torch.Tensor] = {}

    def _seed(self, seed: int | None) -> None:
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(stream_seed(seed))

    def _steps(self, entries: Sequence[Entry]) -> _WindowSteps:
        key = tuple(trajectory_key(e) for e in entries)
        if self._memo is None or self._memo[0] != key:
            self._memo = (key, _window_steps(entries, self.ends))
            self._strict_memo = {}
        return self._memo[1]

    def of_length(self, length: int, strict_length: bool = False) -> SequencesOf:
        """The sampler of sequences of ``length`` steps (this one's stream and ends)."""
        return SequencesOf(self, length, strict_length)

    def draw(
        self,
        n: int,
        length: int,
        entries: Sequence[Entry],
        generator: torch.Generator | None = None,
        *,
        strict_length: bool = False,
        ids: Sequence[int] = (),
    ) -> SequenceDraw:
        """Draw ``n`` sequences over the window ``entries`` (their ends learnt already).

        Every step of the window is a valid start; with ``strict_length`` only those with
        ``length`` steps of their episode ahead (no padding).  With priorities, a start is
        drawn by its row's priority (``ids``: the window's ids, for them).
        """
        if not entries:
            raise EmptyBufferError("cannot sample from an empty buffer: add trajectories first")
        steps = self._steps(entries)
        stream = self.generator if generator is None else generator
        if self.priorities is not None:
            return self._prioritized(steps, n, length, entries, ids, stream, strict_length)
        if strict_length:
            valid = self._strict_memo.get(length)
            if valid is None:
                valid = torch.nonzero(steps.remaining >= length).flatten()
                self._strict_memo[length] = valid
            if len(valid) == 0:
                raise EmptyBufferError(
                    f"no episode in the window has {length} steps ahead of any start: nothing "
                    "to sample with strict_length=True"
                )
            starts = valid[torch.randint(0, len(valid), (n,), generator=stream)]
        else:
            starts = torch.randint(0, len(steps.remaining), (n,), generator=stream)
        return _sequences(steps, starts, length)

    def _prioritized(
        self,
        steps: _WindowSteps,
        n: int,
        length: int,
        entries: Sequence[Entry],
        ids: Sequence[int],
        stream: torch.Generator,
        strict_length: bool,
    ) -> SequenceDraw:
        """Starts drawn by priority (among the valid ones with ``strict_length``)."""
        assert self.priorities is not None
        priorities = self.priorities
        priorities.sync(ids, [int(e["num_samples"]) for e in entries])
        if not strict_length:
            positions, rows, weights = priorities.draw(n, stream)
            starts = steps.row_starts[positions] + rows
            return replace(_sequences(steps, starts, length), weights=weights)
        # Only starts with ``length`` steps ahead: the exact distribution restricted to
        # them (a pass over the window's rows; it grows with the window, not the store).
        masses = priorities.masses() * (steps.remaining.numpy() >= length)
        ends = np.cumsum(masses)
        if not len(ends) or not ends[-1] > 0:
            raise EmptyBufferError(
                f"no episode in the window has {length} steps ahead of any start (of "
                "priority > 0): nothing to sample with strict_length=True"
            )
        drawn = torch.rand(n, generator=stream, dtype=torch.float64).numpy() * ends[-1]
        at = np.minimum(np.searchsorted(ends, drawn, side="right"), len(ends) - 1)
        starts = torch.from_numpy(at.astype(np.int64))
        positions = np.searchsorted(steps.row_ends.numpy(), at, side="right")
        leaves = priorities.leaf_of(positions, at - steps.row_starts.numpy()[positions])
        return replace(_sequences(steps, starts, length), weights=priorities.weights(leaves))

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready: the generator's position (base64)."""
        state = self.generator.get_state().numpy().tobytes()
        return {"generator_state": base64.b64encode(state).decode("ascii")}

    def load_state_dict(self, state: Mapping[str, Any] | None, seed: int | None) -> None:
        """Restore :meth:`state_dict`; without one, restart the stream of ``seed``."""
        encoded = None if state is None else state.get("generator_state")
        if encoded:
            raw = base64.b64decode(encoded)
            self.generator.set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        else:
            self._seed(seed)


@dataclass(frozen=True)
class SequencesOf:
    """A :class:`SequenceSampler` drawing sequences of one ``length``: a ``Sampler``."""

    sequences: SequenceSampler
    length: int
    strict_length: bool

    @property
    def generator(self) -> torch.Generator:
        """The sequence stream."""
        return self.sequences.generator

    def unknown(self, window: Window) -> list[Entry]:
        """The entries of ``window`` whose episode ends are not learnt (those of earlier
        windows are forgotten)."""
        self.sequences.ends.keep_only(window.entries)
        return self.sequences.ends.unknown(window.entries)

    def learn(self, entry: Entry, dones: torch.Tensor) -> None:
        """Learn a trajectory's episode ends from its step ``dones``."""
        self.sequences.ends.learn(entry, dones)

    def draw(
        self, n: int, window: Window, generator: torch.Generator | None = None
    ) -> SequenceDraw:
        """:meth:`SequenceSampler.draw` of this length over ``window``."""
        return self.sequences.draw(
            n,
            self.length,
            window.entries,
            generator,
            strict_length=self.strict_length,
            ids=window.ids,
        )

    def state_dict(self) -> dict[str, Any]:
        """The sequence stream's state."""
        return self.sequences.state_dict()


def stream_seed(seed: int) -> int:
    """The sequence stream's seed, derived from the buffer's (never the same numbers)."""
    state = np.random.SeedSequence([seed % 2**64, 0x5E0]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def _sequences(steps: _WindowSteps, starts: torch.Tensor, length: int) -> SequenceDraw:
    """Positions, rows and mask of the sequences starting at global flat rows ``starts``.

    In numpy: the same values as the torch ops, at a fraction of their per-call cost
    (``searchsorted(side="right")`` is ``bucketize(right=True)``).
    """
    row_starts, time_starts = steps.row_starts.numpy(), steps.time_starts.numpy()
    widths, at = steps.widths.numpy(), starts.numpy()
    first = np.searchsorted(steps.row_ends.numpy(), at, side="right")
    t, env = np.divmod(at - row_starts[first], widths[first])
    span = np.minimum(steps.remaining.numpy()[at], length)  # real steps of each, >= 1
    offsets = np.arange(length, dtype=np.int64)
    # Padding repeats the last real step: those rows are read anyway.
    held = np.minimum(offsets[None, :], (span - 1)[:, None])
    time = (time_starts[first] + t)[:, None] + held
    positions = np.searchsorted(steps.time_ends.numpy(), time, side="right")
    rows = (time - time_starts[positions]) * widths[positions] + env[:, None]
    return SequenceDraw(
        positions=torch.from_numpy(positions.reshape(-1)),
        rows=torch.from_numpy(rows.reshape(-1)),
        mask=torch.from_numpy(offsets[None, :] < span[:, None]),
    )
