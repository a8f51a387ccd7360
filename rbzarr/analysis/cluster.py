"""Per-trajectory work on a ``dask.distributed`` cluster (``--scheduler ADDRESS``) or in process.

A :class:`TrajectoryTasks` runs one function per trajectory, either here or as one task per
trajectory on a client's workers, and hands the results back in index order.  Workers open
the store themselves (from its format, URL and options, for each task), so only
the index entry goes out and only the function's (small) result comes back.  Reductions
that must not depend on where they ran (the moments of ``rbzarr stats``) are merged here,
in index order, so a run on a cluster gives exactly the numbers of a run in one process.
"""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from tqdm import tqdm

from rbzarr.analysis.episodes import Episode, EpisodeTracker
from rbzarr.analysis.progress import progress_bar
from rbzarr.analysis.steps import episode_fields, read_step_arrays
from rbzarr.errors import SchedulerUnavailableError
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import layout_class
from rbzarr.trajectory.steps import DONES

if TYPE_CHECKING:
    from distributed import Client

    from rbzarr.analysis.store_arrays import StoreArrays
    from rbzarr.analysis.view import BufferView

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "TrajectoryTasks", "connect"]

R = TypeVar("R")

# Seconds connect() waits for a scheduler before SchedulerUnavailableError.
DEFAULT_CONNECT_TIMEOUT = 5.0


def connect(address: str, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Client:
    """Connect to the dask scheduler at ``address``, changing no global dask setting.

    Inside ``with client.as_current():`` (or through ``client.compute``) the lazy arrays of
    :meth:`~rbzarr.analysis.view.BufferView.dask_arrays` and
    :meth:`~rbzarr.analysis.view.BufferView.xarray_dataset` compute on the cluster; a
    :class:`TrajectoryTasks` built on the client runs ``rbzarr stats / plot / export``
    there.  A failed connection leaves nothing behind.

    Parameters
    ----------
    address
        The scheduler's address, e.g. ``tcp://10.0.0.5:8786``.
    timeout
        Seconds to wait for the scheduler to answer.

    Returns
    -------
    distributed.Client
        The connected client; close it when done.

    Raises
    ------
    ImportError
        ``distributed`` is not installed (``pip install 'rbzarr[dask]'``).
    SchedulerUnavailableError
        No scheduler answered at ``address`` within ``timeout`` seconds, or ``address`` is
        not an address.
    """
    try:
        from distributed import Client  # noqa: PLC0415 (optional dependency)
    except ImportError as exc:
        raise ImportError("--scheduler needs dask.distributed: pip install 'rbzarr[dask]'") from exc
    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except Exception as exc:  # refused, timed out, not an address, not a dask scheduler
        reason = f"{type(exc).__name__}: {exc}"
    # The half-built client is garbage now, and its __del__ takes dask's process-wide loop
    # lock: collected later, inside the next client's start (which holds that lock), it
    # deadlocks.  So it is collected here, where no dask lock is held.
    gc.collect()
    raise SchedulerUnavailableError(
        f"no dask scheduler answered at {address!r} within {timeout:g} s: {reason}"
    )


@dataclass(frozen=True)
class _StoreAddress:
    """What a worker needs to open a store: its format, URL and fsspec options."""

    format: str
    url: str
    storage_options: Mapping[str, Any]

    @classmethod
    def of(cls, layout: TrajectoryLayout) -> _StoreAddress:
        return cls(layout.format, layout.location.url, dict(layout.location.storage_options))

    def open(self) -> TrajectoryLayout:
        return layout_class(self.format)(Location.from_url(self.url, self.storage_options))


def _run_remote(function: Callable[..., R], address: _StoreAddress, entry: Mapping[str, Any]) -> R:
    """A task: ``function(layout, entry)`` with the store opened in the worker."""
    return function(address.open(), entry)


def _steps_part(
    keys: Sequence[str] | None,
    reduce: Callable[[dict[str, np.ndarray]], Any],
    carried: frozenset[str] | None,
    with_episodes: bool,
    layout: TrajectoryLayout,
    entry: Mapping[str, Any],
) -> tuple[Any, dict[str, np.ndarray]]:
    """One trajectory read (into numpy): ``reduce`` of its time steps, and the fields
    episodes carry."""
    steps = read_step_arrays(layout, entry, keys)
    fields = episode_fields(steps, entry, carried, layout.location.url) if with_episodes else {}
    return reduce(steps), fields


def _nothing(steps: Mapping[str, np.ndarray]) -> None:
    """What :meth:`TrajectoryTasks.episodes` keeps of a trajectory's steps: nothing."""


def _copy_trajectory(
    destination: _StoreAddress, layout: TrajectoryLayout, entry: Mapping[str, Any]
) -> None:
    """Decode one trajectory of ``layout`` and write it into ``destination``."""
    destination.open().write(dict(entry), layout.read(entry))


class TrajectoryTasks:
    """Runs one function per trajectory, in index order: here, or as dask tasks on a client.

    Parameters
    ----------
    client
        A ``distributed.Client`` (see :func:`connect`); ``None`` runs everything in this
        process.
    ahead
        At most this many tasks are in flight at once (default: twice the cluster's
        threads), so a large store is not held in the workers' memory all at once.
    """

    def __init__(self, client: Client | None = None, ahead: int | None = None) -> None:
        self.client = client
        if ahead is None and client is not None:
            ahead = 2 * max(1, sum(client.nthreads().values()))
        self.ahead = max(1, ahead or 1)

    def map(
        self,
        function: Callable[[TrajectoryLayout, Mapping[str, Any]], R],
        layout: TrajectoryLayout,
        entries: Iterable[Mapping[str, Any]],
        progress: bool = False,
    ) -> Iterator[R]:
        """``function(layout, entry)`` for each entry, yielded in the order of ``entries``.

        On a client ``function`` must pickle (a module-level function or a ``partial`` of
        one); it gets the store opened in the worker.  A task's error is raised here, as
        the same exception class.

        Parameters
        ----------
        function
            Called with the opened store and one index entry.
        layout
            The store, as opened here.
        entries
            Index entries, in the order wanted.
        progress
            Show a tqdm bar on stderr.

        Yields
        ------
        object
            Each entry's result.
        """
        entries = list(entries)
        bar = progress_bar(len(entries), "trajectories", progress)
        with bar:
            if self.client is None:
                for entry in entries:
                    yield function(layout, entry)
                    bar.update()
                return
            submit = partial(
                self.client.submit, _run_remote, function, _StoreAddress.of(layout), pure=False
            )
            queued = iter(entries)
            pending = collections.deque(submit(entry) for entry in islice(queued, self.ahead))
            while pending:
                result = pending.popleft().result()
                pending.extend(submit(entry) for entry in islice(queued, 1))
                yield result
                bar.update()

    def steps_and_episodes(
        self,
        view: BufferView | StoreArrays,
        keys: Sequence[str] | None,
        reduce: Callable[[dict[str, np.ndarray]], R],
        *,
        progress: bool = False,
        across_trajectories: bool = True,
        episode_keys: Sequence[str] | None = None,
        with_episodes: bool = True,
    ) -> Iterator[tuple[int, R, list[Episode]]]:
        """Like ``view.iter_steps_and_episodes``, but ``reduce(steps)`` runs where the read runs.

        Steps are read into numpy (:func:`~rbzarr.analysis.steps.read_step_arrays`: a zarr
        store without torch), and the episodes carry numpy fields.  Only ``reduce``'s
        result and the fields the episodes carry come back from a worker; episodes are
        followed here, in index order.

        Parameters
        ----------
        view
            The store (a view, or its arrays: ``ids``, ``entry``, ``run_continues`` and
            ``layout`` are used).
        keys
            Flat keys to read (``dones`` is added when episodes are wanted).
        reduce
            Maps one trajectory's time steps to what the caller keeps (it must pickle).
        progress, across_trajectories, episode_keys
            As for ``view.iter_steps_and_episodes``.
        with_episodes
            ``False``: cut no episodes (a store without ``dones``); every list is empty.

        Yields
        ------
        tuple of (int, object, list of Episode)
            Each committed id, ``reduce`` of its steps, and the episodes that end in it.

        Raises
        ------
        ValueError
            With episodes: a trajectory has no ``dones`` field.
        """
        wanted = keys
        carried = None
        if with_episodes:
            wanted = None if keys is None else list(dict.fromkeys([*keys, DONES]))
            carried = None if episode_keys is None else frozenset({*episode_keys, DONES})
        part = partial(_steps_part, wanted, reduce, carried, with_episodes)
        ids = view.ids
        entries = [view.entry(i) for i in ids]
        runs = view.run_continues(across_trajectories)
        tracker = EpisodeTracker()
        results = self.map(part, view.layout, entries, progress)
        for trajectory_id, (reduced, fields), run_continues in zip(ids, results, runs, strict=True):
            episodes = tracker.feed(trajectory_id, fields, run_continues) if with_episodes else []
            yield trajectory_id, reduced, episodes

    def episodes(
        self,
        view: BufferView | StoreArrays,
        keys: Sequence[str],
        *,
        progress: bool = False,
        across_trajectories: bool = True,
    ) -> Iterator[Episode]:
        """Every episode, in the order ``view.iter_episodes`` yields them, carrying ``keys``
        (``dones`` always) as numpy arrays.

        Parameters
        ----------
        view
            The store, as for :meth:`steps_and_episodes`.
        keys
            Flat keys to read and carry.
        progress, across_trajectories
            As for :meth:`steps_and_episodes`.

        Yields
        ------
        Episode
            Complete episodes, and incomplete ones where their run ends.
        """
        stream = self.steps_and_episodes(
            view,
            keys,
            _nothing,
            progress=progress,
            across_trajectories=across_trajectories,
            episode_keys=keys,
        )
        for _, _, ended in stream:
            yield from ended

    def copy(
        self,
        source: TrajectoryLayout,
        destination: TrajectoryLayout,
        entries: Sequence[Mapping[str, Any]],
        progress: bool = False,
    ) -> None:
        """Decode each trajectory of ``source`` and write it into ``destination``.

        Parameters
        ----------
        source
            The store read.
        destination
            The store written (on a client, each worker opens it by URL and options).
        entries
            The index entries to copy.
        progress
            Show a tqdm bar on stderr.
        """
        if self.client is None:
            for entry in tqdm(entries, desc="export", unit="traj", disable=not progress):
                destination.write(dict(entry), source.read(entry))
            return
        copy = partial(_copy_trajectory, _StoreAddress.of(destination))
        for _ in self.map(copy, source, entries, progress):
            pass
