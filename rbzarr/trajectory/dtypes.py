"""Torch dtypes by name, and their lossless numpy storage form.

numpy has no ``bfloat16``: such tensors are stored as their raw 16-bit pattern (``uint16``)
and the torch dtype is recorded by name beside the data, so a round trip is bit-exact.
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
    """The name of a torch dtype as stored in rbzarr files (``"float32"``, ``"bfloat16"``).

    Parameters
    ----------
    dtype
        A torch dtype.

    Returns
    -------
    str
        The name :func:`dtype_from_name` maps back to ``dtype``.

    Raises
    ------
    ValueError
        ``dtype`` is not one rbzarr stores (e.g. a quantized or float8 dtype).
    """
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ValueError(
            f"unsupported torch dtype {dtype}; supported: {sorted(_BY_NAME)}"
        ) from None


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype stored under ``name``.

    Parameters
    ----------
    name
        A dtype name as :func:`dtype_name` writes it, e.g. ``"bfloat16"``.

    Returns
    -------
    torch.dtype
        The dtype of that name.

    Raises
    ------
    ValueError
        ``name`` is not a known dtype name; the message lists the known ones.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}; known: {sorted(_BY_NAME)}") from None


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array holding ``tensor``'s exact bits (a view when already on the CPU).

    Parameters
    ----------
    tensor
        Any tensor; it is detached and moved to the CPU first.

    Returns
    -------
    numpy.ndarray
        The same shape; a ``bfloat16`` tensor comes back as its ``uint16`` bit pattern.
    """
    tensor = tensor.detach().cpu()
    view = _BIT_VIEWS.get(tensor.dtype)
    if view is not None:
        tensor = tensor.view(view)
    return tensor.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The tensor of torch ``dtype`` whose bits ``array`` holds; inverse of :func:`to_numpy`.

    Parameters
    ----------
    array
        The stored array (``uint16`` bits for ``bfloat16``).
    dtype
        The torch dtype recorded beside the data.

    Returns
    -------
    torch.Tensor
        A CPU tensor of ``dtype``; it shares memory with ``array`` when ``array`` is
        contiguous and already of that dtype (or its bit view).
    """
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.view(dtype) if dtype in _BIT_VIEWS else tensor.to(dtype)


def byte_rows(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as writable uint8 rows ``[len, row_bytes]`` (a view, no copy).

    Parameters
    ----------
    tensor
        A contiguous CPU tensor with at least one dimension.

    Returns
    -------
    numpy.ndarray
        ``uint8`` array of shape ``[len(tensor), row_bytes]`` sharing ``tensor``'s memory.
    """
    array = to_numpy(tensor)
    flat = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    return flat.view(np.uint8)
