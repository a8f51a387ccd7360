"""Torch dtypes by name, and their lossless numpy storage form.

numpy has no ``bfloat16``: it is stored as its raw 16 bits (``uint16``), the torch dtype
recorded by name beside the data, so a round trip is bit-exact.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["byte_rows", "dtype_from_name", "dtype_name", "from_numpy", "to_numpy"]

_BY_NAME: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
_NAMES = {dtype: name for name, dtype in _BY_NAME.items()}
# dtypes numpy cannot hold, mapped to a same-width integer dtype whose bits we store.
_BIT_VIEWS = {torch.bfloat16: torch.uint16}


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a torch dtype as stored in rbzarr files (``"float32"``, ``"bfloat16"``)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ValueError(
            f"unsupported torch dtype {dtype}; supported: {sorted(_BY_NAME)}"
        ) from None


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype stored under ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}; known: {sorted(_BY_NAME)}") from None


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array holding ``tensor``'s exact bits (a view when already on the CPU)."""
    tensor = tensor.detach().cpu()
    view = _BIT_VIEWS.get(tensor.dtype)
    if view is not None:
        tensor = tensor.view(view)
    return tensor.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The tensor of torch ``dtype`` whose bits ``array`` holds; inverse of :func:`to_numpy`."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.view(dtype) if dtype in _BIT_VIEWS else tensor.to(dtype)


def byte_rows(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as writable uint8 rows ``[len, row_bytes]`` (a view, no copy)."""
    array = to_numpy(tensor)
    flat = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    return flat.view(np.uint8)
