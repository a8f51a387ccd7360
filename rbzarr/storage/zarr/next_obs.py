"""``next_obs`` stored once: rows equal to the following ``curr_obs`` row are not stored again.

In RLinf trajectories ``next_obs[t] == curr_obs[t + 1]`` except where an episode ended
(auto-reset) and at the last step.  For a key ``next_obs/<name>`` whose ``curr_obs/<name>``
has the same shape ``[T, B, ...]``, dtype and image codec, the writer compares the rows byte
for byte (:func:`differing_rows`) and stores only the rows that differ, as an array of shape
``[M, 1, ...]`` (row ``m`` is element ``explicit[m]``).  The trajectory group's description
of the key adds::

    "same_as": "curr_obs/<name>", "rows": [T, B], "explicit": [t * B + b, ...]  (sorted)

A plain zarr reader rebuilds the array: ``next[t, b]`` is stored row
``explicit.index(t * B + b)`` when listed, else ``curr[t + 1, b]`` (:func:`rebuild`).  Keys
whose rows mostly differ (more than half) are stored whole, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rbzarr.storage.zarr.chunking import KeyPlan
from rbzarr.trajectory.dtypes import to_numpy

if TYPE_CHECKING:
    import torch

__all__ = ["CURR", "NEXT", "differing_rows", "pair_of", "rebuild", "split_elements"]

CURR = "curr_obs/"
NEXT = "next_obs/"


def pair_of(
    key: str, fields: Mapping[str, torch.Tensor], plans: Mapping[str, KeyPlan], T: int
) -> str | None:
    """The ``curr_obs`` key that ``next_obs`` key ``key`` may share rows with, or ``None``.

    Both must be ``[T, B, ...]`` arrays of one dtype stored by the same image codec.
    """
    if not key.startswith(NEXT):
        return None
    pair = CURR + key[len(NEXT) :]
    mine, theirs = plans[key], plans.get(pair)
    if theirs is None or not mine.image or not theirs.image:  # not both frames
        return None
    value, other = fields[key], fields[pair]
    if value.shape != other.shape or value.dtype != other.dtype or value.shape[0] != T:
        return None
    return pair if mine.codec.text == theirs.codec.text and mine.image == theirs.image else None


def differing_rows(next_value: torch.Tensor, curr_value: torch.Tensor) -> np.ndarray:
    """Sorted elements ``t * B + b`` whose ``next`` row differs (byte for byte) from
    ``curr[t + 1, b]``; every row of the last step is listed."""
    nxt, cur = to_numpy(next_value), to_numpy(curr_value)
    T, B = nxt.shape[:2]
    nxt, cur = nxt.reshape(T, B, -1), cur.reshape(T, B, -1)
    differ = np.ones((T, B), dtype=bool)
    for t in range(T - 1):  # a step at a time: no temporary the size of the frames
        differ[t] = ~(nxt[t] == cur[t + 1]).all(axis=1)
    return np.flatnonzero(differ.reshape(-1)).astype(np.int64)


def split_elements(
    explicit: np.ndarray, B: int, elements: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(own, stored_rows, borrowed)``: a mask of ``elements`` stored in the key's own array,
    their rows there, and the ``curr_obs`` elements the others are read from."""
    found = np.searchsorted(explicit, elements)
    clipped = np.minimum(found, len(explicit) - 1)
    own = explicit[clipped] == elements
    return own, clipped[own], elements[~own] + B


def rebuild(stored: np.ndarray, curr: np.ndarray, explicit: np.ndarray) -> np.ndarray:
    """The full ``[T, B, ...]`` array from its stored rows ``[M, 1, ...]`` and ``curr``."""
    T, B = curr.shape[:2]
    flat = np.empty((T * B, *curr.shape[2:]), dtype=curr.dtype)
    flat[: (T - 1) * B] = curr[1:].reshape((T - 1) * B, *curr.shape[2:])
    flat[explicit] = stored.reshape(len(explicit), *curr.shape[2:])
    return flat.reshape(curr.shape)


def describe(explicit: np.ndarray, pair: str, T: int, B: int) -> dict[str, Any]:
    """The keys a shared ``next_obs`` array adds to its description."""
    return {"same_as": pair, "rows": [T, B], "explicit": explicit.tolist()}
