"""Candidate codecs tried on a sample of a store's own frames (``rbzarr codecs``)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.storage.zarr.codecs import CANDIDATES, image_layout, parse_codec, psnr

__all__ = ["image_keys", "try_codecs"]

# Trajectories the frames are drawn from (spread over the store), and frames per key.
SAMPLED_TRAJECTORIES = 4
DEFAULT_FRAMES = 64


def image_keys(schema: Mapping[str, Any]) -> list[str]:
    """The image-like keys of a store's schema (``{key: [dtype name, per-row shape]}``), in
    its order: uint8 frames (:func:`~rbzarr.storage.zarr.codecs.image_layout`)."""
    found = []
    for key, (dtype, shape) in schema.items():
        # numpy does not name every dtype (bfloat16): only uint8 can be a frame
        if dtype == "uint8" and image_layout([1, 1, *shape], dtype) is not None:
            found.append(key)
    return found


def try_codecs(
    source: str | os.PathLike[str] | Location,
    keys: Sequence[str] | None = None,
    candidates: Iterable[str] = CANDIDATES,
    frames: int = DEFAULT_FRAMES,
    storage_options: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Encode and decode a sample of each image key's frames with each candidate codec.

    Nothing is written: the frames are read from the store, encoded one at a time in memory
    and decoded again.

    Parameters
    ----------
    source
        A store's URL or path.
    keys
        The image-like keys to try (default: every one the store's schema has).
    candidates
        Codec specs (``"qoi"``, ``"jpeg:95"``, ...); default ``CANDIDATES``.
    frames
        Frames per key, drawn evenly from up to 4 trajectories spread over the store.
    storage_options
        fsspec options of ``source``.

    Returns
    -------
    list of dict
        One row per key and candidate: ``key``, ``codec``, ``ratio`` (encoded / raw bytes),
        ``psnr`` (dB; ``inf`` when lossless), ``encode_fps`` and ``decode_fps`` (frames per
        CPU second of this thread: per core), or ``error`` when the codec cannot be used.

    Raises
    ------
    ValueError
        A named key is not in the store or not image-like, ``frames`` is below 1, or a spec
        is malformed.
    CheckpointNotFoundError
        ``source`` is not a store.
    """
    if frames < 1:
        raise ValueError(f"frames must be at least 1, got {frames}")
    specs = [parse_codec(spec) for spec in candidates]
    reader, documents = open_store(source, storage_options)
    schema = documents.metadata.get("schema") or {}
    available = image_keys(schema)
    wanted = list(keys) if keys else available
    for key in wanted:
        if key not in available:
            known = ", ".join(available) or "none"
            raise ValueError(f"{reader.location.url}: {key!r} is not an image-like key ({known})")
    index = TrajectoryIndex.from_documents(documents, reader.location.url)
    ids = index.id_list
    count = min(SAMPLED_TRAJECTORIES, len(ids))
    picked = sorted({ids[i * len(ids) // count] for i in range(count)})
    sampled: dict[str, list[np.ndarray]] = {key: [] for key in wanted}
    for trajectory_id in picked:
        tensors = reader.read(index.entries[trajectory_id], wanted).tensors()
        for key in wanted:
            value = tensors[key].numpy()
            sampled[key].append(value.reshape(-1, *value.shape[2:]))
    rows: list[dict[str, Any]] = []
    for key in wanted:
        if not sampled[key]:
            continue
        stacked = np.concatenate(sampled[key])
        chosen = stacked[np.linspace(0, len(stacked) - 1, min(frames, len(stacked))).astype(int)]
        if image_layout([1, 1, *chosen.shape[1:]], chosen.dtype) == "chw":
            chosen = np.ascontiguousarray(chosen.transpose(0, 2, 3, 1))
        rows.extend(_trial(key, spec, chosen) for spec in specs)
    return rows


def _trial(key: str, spec: Any, frames: np.ndarray) -> dict[str, Any]:
    """One codec on ``frames`` (``[N, H, W, C]``): ratio, PSNR, frames per CPU second."""
    row: dict[str, Any] = {"key": key, "codec": spec.text, "frames": len(frames)}
    try:
        encode, decode = _coders(spec, frames.shape[1:])
        start = time.thread_time()
        encoded = [encode(frame) for frame in frames]
        encode_s = time.thread_time() - start
        start = time.thread_time()
        decoded = np.stack([decode(data) for data in encoded])
        decode_s = time.thread_time() - start
    except (ImportError, RuntimeError, ValueError) as exc:
        return {**row, "error": f"{type(exc).__name__}: {exc}"}
    row["ratio"] = sum(len(data) for data in encoded) / frames.nbytes
    row["psnr"] = psnr(frames, decoded.reshape(frames.shape))
    row["encode_fps"] = _rate(len(frames), encode_s)
    row["decode_fps"] = _rate(len(frames), decode_s)
    return row


def _rate(count: int, seconds: float) -> float:
    return math.inf if seconds <= 0 else count / seconds


Coder = Callable[[Any], Any]


def _coders(spec: Any, shape: Sequence[int]) -> tuple[Coder, Coder]:
    """Encode and decode functions of one frame for a codec spec."""
    codec = spec.resolved(int(shape[-1]))
    return codec.encode_frame, (lambda data: codec.decode_frame(data, np.empty(shape, np.uint8)))
