"""``on_damaged``: what sampling does when a stored trajectory's data is damaged or missing.

``"raise"`` (the default): the read's :class:`~rbzarr.errors.CorruptStoreError` (or
:class:`~rbzarr.errors.CheckpointNotFoundError` of a pt/pkl file) reaches the caller, as
every other read does.

``"skip"``: a batch whose stored rows cannot be read is read again one trajectory at a time
to find the damaged ones.  Those leave the buffer's index (as if evicted: the window takes
the next older trajectory, the store and its index are left as they are), each is warned
about once (:class:`~rbzarr.errors.DamagedTrajectoryWarning`, naming the id, the path and
the repair command) and listed in ``get_stats()["damaged_trajectories"]``, and the batch is
drawn again from the generator state it was first drawn from.  So the batches are those of
a buffer whose index never listed the damaged trajectories, from the batch that met them
on: the same seed and the same store give the same batches.  Storage that is unavailable
is never taken for damage: it raises as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from rbzarr.caller import warn_caller
from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, DamagedTrajectoryWarning
from rbzarr.sampling.rows import MissPlan, read_batch
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory.model import Trajectory

__all__ = ["ON_DAMAGED", "DamagedRowsError", "DamagedTrajectories", "check_on_damaged"]

ON_DAMAGED = ("raise", "skip")
# What a read of damaged or missing data raises; anything else (unavailable storage) is not damage.
DAMAGE = (CorruptStoreError, CheckpointNotFoundError)

Result = TypeVar("Result")


class DamagedRowsError(CorruptStoreError):
    """A batch met damaged trajectories (``found``: id to the read's message); the buffer
    drops them and draws again, so this never reaches a caller."""

    def __init__(self, found: dict[int, str]) -> None:
        super().__init__("; ".join(found.values()))
        self.found = found


def check_on_damaged(on_damaged: str) -> str:
    """``on_damaged`` if it is one of :data:`ON_DAMAGED`, else a ``ValueError`` naming them."""
    if on_damaged not in ON_DAMAGED:
        raise ValueError(f"on_damaged must be one of {ON_DAMAGED}, got {on_damaged!r}")
    return on_damaged


class DamagedTrajectories:
    """The ``on_damaged`` policy of one buffer, and the trajectories it dropped so far."""

    def __init__(self, on_damaged: str) -> None:
        self.policy = check_on_damaged(on_damaged)
        self.dropped: dict[int, str] = {}

    def read(self, plan: MissPlan, layout: TrajectoryLayout | None) -> dict[str, torch.Tensor]:
        """:func:`~rbzarr.sampling.rows.read_batch`; with ``"skip"`` a damaged read
        raises :class:`DamagedRowsError` naming the damaged trajectories."""
        try:
            return read_batch(plan, layout)
        except DAMAGE as exc:
            if self.policy != "skip" or layout is None:
                raise
            found = _damaged_of(plan, layout)
            if not found:
                raise
            raise DamagedRowsError(found) from exc

    def sampling(
        self,
        sample: Callable[[], Result],
        generator: torch.Generator,
        drop: Callable[[dict[int, str]], None],
    ) -> Result:
        """``sample()``; each time it meets damaged trajectories, ``generator`` is set back
        to its state before the call, ``drop`` removes them from the index and it runs again."""
        if self.policy != "skip":
            return sample()
        state = generator.get_state()
        while True:
            try:
                return sample()
            except DamagedRowsError as exc:
                generator.set_state(state)
                drop(exc.found)

    def record(self, found: dict[int, str], url: str) -> None:
        """Note ``found`` as dropped and warn once about each (call once they left the index)."""
        for trajectory_id, message in found.items():
            if trajectory_id in self.dropped:
                continue
            self.dropped[trajectory_id] = message
            repair = f"`rbzarr verify --repair --drop-damaged {url}`"
            hint = "" if repair in message else f"; {repair} drops it from the store's index"
            warn_caller(
                f"on_damaged='skip' dropped trajectory {trajectory_id} from the sample window "
                f"(the store is unchanged): {message}{hint}",
                DamagedTrajectoryWarning,
            )

    def read_one(self, layout: TrajectoryLayout, entry: Entry, keys: Sequence[str]) -> Trajectory:
        """``layout.read(entry, keys)``; with ``"skip"`` damage raises :class:`DamagedRowsError`."""
        try:
            return layout.read(entry, keys)
        except DAMAGE as exc:
            if self.policy != "skip":
                raise
            raise DamagedRowsError(
                {int(entry["trajectory_id"]): _named(layout, entry, exc)}
            ) from exc


def _named(layout: TrajectoryLayout, entry: Entry, exc: BaseException) -> str:
    """The read's message, after the trajectory's path where the message lacks it."""
    path = f"{layout.location.url}/{'/'.join(layout.trajectory_path(entry))}"
    return str(exc) if path in str(exc) else f"{path}: {exc}"


def _damaged_of(plan: MissPlan, layout: TrajectoryLayout) -> dict[int, str]:
    """Each stored trajectory of ``plan`` whose rows fail to read alone: id to message."""
    keys = list(plan.schema)
    found: dict[int, str] = {}
    for g, (entry, held) in enumerate(zip(plan.misses.entries, plan.pending, strict=True)):
        if held is not None:
            continue
        rows, _ = plan.misses.group(g)
        try:
            layout.read_rows(entry, rows, keys)
        except DAMAGE as exc:
            found[int(entry["trajectory_id"])] = _named(layout, entry, exc)
    return found
