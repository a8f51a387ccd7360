"""What validation checks of a trajectory's shapes, from shapes and dtype names alone.

:func:`~rbzarr.trajectory.model.validate` checks a trajectory's tensors with it; ``rbzarr
verify`` checks decoded numpy arrays with it, without torch.  Every field agrees on ``T``
and ``B``; ``dones``, ``terminations`` and ``truncations`` may hold ``T + E`` rows (E
rollout epochs, each led by one reset row).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rbzarr.errors import InvalidTrajectoryError
from rbzarr.trajectory.fields import RESET_ROW_FIELDS

__all__ = ["Schema", "TrajectorySpec", "check_shapes"]

# path -> (torch dtype name, trailing shape after the sample dimension)
Schema = dict[str, tuple[str, tuple[int, ...]]]


@dataclass(frozen=True)
class TrajectorySpec:
    """What validation learnt about a trajectory."""

    T: int
    B: int
    shape: tuple[int, ...]
    schema: Schema

    @property
    def num_samples(self) -> int:
        """Rows in the flat view: ``T * B``."""
        return self.T * self.B


def check_shapes(
    shapes: Mapping[str, tuple[int, ...]],
    dtype_of: Callable[[str], str],
    schema: Schema | None = None,
) -> TrajectorySpec:
    """Check that the fields of ``shapes`` (flat path to shape) agree on T and B, and with
    ``schema`` if given; ``dtype_of(path)`` names a ``[T, B, ...]`` field's dtype.

    Raises
    ------
    InvalidTrajectoryError
        No reference field, a field that disagrees on ``T`` or ``B``, or fields that
        differ from ``schema``.
    """
    ref_name, ref = _reference(shapes)
    if len(ref) < 2:
        raise InvalidTrajectoryError(
            f"field {ref_name!r}: expected [T, B, ...], got shape {tuple(ref)}"
        )
    T, B, agreeing = _majority_shape(shapes, ref_name, ref)
    if T * B == 0:
        raise InvalidTrajectoryError(
            f"field {ref_name!r}: trajectory carries no samples, shape {tuple(ref)}"
        )
    found: Schema = {}
    for path, shape in shapes.items():
        if len(shape) < 2:
            continue
        rows = int(shape[0])
        epochs = _epochs(path, rows, T)
        if rows - epochs != T or shape[1] != B:
            named = ", ".join(repr(name) for name in agreeing[:3])
            more = f" and {len(agreeing) - 3} more" if len(agreeing) > 3 else ""
            raise InvalidTrajectoryError(
                f"field {path!r}: expected T={T}, B={B} as {named}{more}, got {tuple(shape)}"
            )
        found[path] = (dtype_of(path), tuple(int(d) for d in shape[2:]))
    if schema is not None:
        if found != schema:
            raise InvalidTrajectoryError(_schema_difference(schema, found))
        found = dict(schema)
    return TrajectorySpec(T=T, B=B, shape=tuple(int(d) for d in ref), schema=found)


def _reference(shapes: Mapping[str, tuple[int, ...]]) -> tuple[str, tuple[int, ...]]:
    for name in ("prev_logprobs", "rewards"):
        shape = shapes.get(name)
        if shape is not None:
            return name, shape
    raise InvalidTrajectoryError(
        "trajectory carries no samples: it has neither 'prev_logprobs' nor 'rewards'"
    )


def _majority_shape(
    shapes: Mapping[str, tuple[int, ...]], ref_name: str, ref: tuple[int, ...]
) -> tuple[int, int, list[str]]:
    """The ``(T, B)`` most fields hold (``ref``'s on a tie), and the fields that hold it.

    A field whose leading dimensions disagree is then the one blamed, whichever field the
    trajectory's ``T`` is usually read from.
    """
    votes: dict[tuple[int, int], list[str]] = {}
    for path, shape in shapes.items():
        if len(shape) >= 2 and path not in RESET_ROW_FIELDS:
            votes.setdefault((int(shape[0]), int(shape[1])), []).append(path)
    reference = (int(ref[0]), int(ref[1]))
    best = max(votes, key=lambda pair: (len(votes[pair]), pair == reference), default=None)
    T, B = reference if best is None else best
    return T, B, votes.get((T, B), [ref_name])


def _epochs(path: str, rows: int, T: int) -> int:
    """Number of reset rows in a field with ``rows`` raw rows (0 unless a reset-row field).

    Raises
    ------
    InvalidTrajectoryError
        A reset-row field's extra rows ``E`` are negative or do not divide ``T``.
    """
    if path not in RESET_ROW_FIELDS or rows == T:
        return 0
    extra = rows - T
    if extra < 0 or T % extra != 0:
        raise InvalidTrajectoryError(
            f"field {path!r}: expected T={T} rows, or T+E rows with E dividing T, got {rows}"
        )
    return extra


def _schema_difference(expected: Schema, got: Schema) -> str:
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    if missing or extra:
        return f"fields differ from the buffer's schema: missing {missing}, unexpected {extra}"
    for path, want in expected.items():
        if got[path] != want:
            return (
                f"field {path!r}: expected dtype {want[0]} and trailing shape {want[1]}, "
                f"got dtype {got[path][0]} and trailing shape {got[path][1]}"
            )
    raise AssertionError("schemas differ only in key order")  # pragma: no cover
