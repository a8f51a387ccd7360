"""CPU tensors seen through numpy, so that small copies and reshapes keep the GIL.

Each torch call lets go of the GIL; a writer thread taking it then holds it until its next
file call while the caller's thread waits (on a VM, a switch to the other core costs about
as much as a small trajectory's own work).  numpy keeps the GIL for small arrays, so the
hot paths reshape and copy a plain tensor's rows through :func:`numpy_view`: a CPU tensor
of one of numpy's dtypes that autograd does not track.  Other tensors (a GPU's, bfloat16,
complex, tracked ones) go through torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["NUMPY_DTYPES", "copy_rows", "numpy_view", "reshaped"]

# Torch dtypes numpy holds as they are.
NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
    }
)


def numpy_view(tensor: torch.Tensor) -> np.ndarray | None:
    """``tensor``'s memory as a numpy array (no copy), or ``None`` for a tensor numpy does
    not hold as it is (not on the CPU, another dtype, tracked by autograd)."""
    if tensor.dtype not in NUMPY_DTYPES or tensor.requires_grad or tensor.device.type != "cpu":
        return None
    return tensor.numpy()


def reshaped(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``tensor.reshape(shape)`` (a view where the strides allow, else a copy)."""
    array = numpy_view(tensor)
    if array is None:
        return tensor.reshape(*shape)
    return torch.from_numpy(array.reshape(shape))


def copy_rows(target: torch.Tensor, where: tuple[int, slice], source: torch.Tensor) -> None:
    """``target[where].copy_(source)``: ``source``'s rows into a part of ``target``."""
    into, rows = numpy_view(target), numpy_view(source)
    if into is None or rows is None or into.dtype != rows.dtype:
        target[where].copy_(source)
    else:
        into[where] = rows
