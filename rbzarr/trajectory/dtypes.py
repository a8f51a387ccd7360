"""Torch dtypes by name, and their lossless numpy storage form.

numpy has no ``bfloat16``: it is stored as its raw 16 bits (``uint16``), the torch dtype
recorded by name beside the data, so a round trip is bit-exact.  The names and their
numpy storage dtypes need no torch (the read-only tools decode into numpy); torch is
imported only by the functions that take or make tensors.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "byte_rows",
    "dtype_from_name",
    "dtype_name",
    "from_numpy",
    "numbers",
    "storage_dtype",
    "to_numpy",
]

# Every dtype rbzarr stores, by name (torch's attribute name), as numpy holds its bits.
_STORAGE: dict[str, np.dtype] = {
    name: np.dtype(held)
    for name, held in {
        "bool": "bool",
        "uint8": "uint8",
        "int8": "int8",
        "int16": "int16",
        "int32": "int32",
        "int64": "int64",
        "uint16": "uint16",
        "uint32": "uint32",
        "uint64": "uint64",
        "float16": "float16",
        "bfloat16": "uint16",  # its raw bits
        "float32": "float32",
        "float64": "float64",
        "complex64": "complex64",
        "complex128": "complex128",
    }.items()
}
# dtypes numpy cannot hold, stored as a same-width integer dtype's bits.
_BIT_VIEWS = frozenset({"bfloat16"})


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype holding the bits of the dtype stored under ``name`` (no torch)."""
    try:
        return _STORAGE[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dtype name {name!r}; known: {sorted(_STORAGE)}") from None


def numbers(array: np.ndarray, name: str) -> np.ndarray:
    """The values of ``array``, held as dtype ``name`` is stored (:func:`storage_dtype`), as
    numpy numbers: ``bfloat16``'s bits widened to ``float32`` (exact), others as they are."""
    if name not in _BIT_VIEWS:
        return array
    return (array.astype(np.uint32) << 16).view(np.float32)


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a torch dtype as stored in rbzarr files (``"float32"``, ``"bfloat16"``)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _STORAGE:
        raise ValueError(f"unsupported torch dtype {dtype}; supported: {sorted(_STORAGE)}")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype stored under ``name``."""
    import torch  # noqa: PLC0415 (the read-only tools never ask for a torch dtype)

    storage_dtype(name)
    dtype: torch.dtype = getattr(torch, name)
    return dtype


@functools.cache
def _bit_view(dtype: torch.dtype) -> torch.dtype | None:
    """The integer dtype whose bits hold ``dtype`` in numpy, or ``None`` (numpy holds it)."""
    name = str(dtype).removeprefix("torch.")
    return dtype_from_name(_STORAGE[name].name) if name in _BIT_VIEWS else None


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array holding ``tensor``'s exact bits (a view when already on the CPU)."""
    if tensor.requires_grad or tensor.device.type != "cpu":
        # Only then: each of these calls lets go of the GIL, and a writer thread taking
        # it back waits for the caller's thread (a tiny trajectory's write paid ~6 waits).
        tensor = tensor.detach().cpu()
    view = _bit_view(tensor.dtype)
    if view is not None:
        tensor = tensor.view(view)
    return tensor.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The tensor of torch ``dtype`` whose bits ``array`` holds; inverse of :func:`to_numpy`."""
    import torch  # noqa: PLC0415

    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.view(dtype) if _bit_view(dtype) is not None else tensor.to(dtype)


def byte_rows(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
    """A CPU tensor's (or an array's) memory as writable uint8 rows ``[len, row_bytes]``
    (a view, no copy)."""
    array = tensor if isinstance(tensor, np.ndarray) else to_numpy(tensor)
    flat = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    return flat.view(np.uint8)
