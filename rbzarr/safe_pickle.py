"""Loading pickles without running arbitrary code.

:func:`safe_load` unpickles with a :class:`RestrictedUnpickler` that resolves only the
globals tensors, numpy arrays and plain containers need.  Anything else (``os.system``,
``builtins.eval``, a user class, ...) raises :class:`~rbzarr.errors.UnsafePickleError`
naming ``module.global`` and the source before it is called.

``pickle.dumps`` of a tensor refers to ``torch.storage._load_from_bytes``, which runs
``torch.load(weights_only=False)`` on the embedded storage: it is never resolved as is, but
replaced by a loader that reads those bytes with ``weights_only=True``.  Tensor views are
checked to lie inside their storage before they are built.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import pickle
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import torch
import torch._utils

try:
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # numpy < 2
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as _numeric  # type: ignore[no-redef]

from rbzarr.errors import CorruptStoreError, UnsafePickleError

__all__ = ["RestrictedUnpickler", "safe_load"]

# numpy moved its internals from numpy.core to numpy._core in 2.0; pickles name either.
_NUMPY_PACKAGES = ("numpy.core", "numpy._core")


def _check_view(storage: Any, offset: int, size: Any, stride: Any) -> None:
    """Refuse a tensor view reaching past its storage.

    torch would otherwise grow the storage to fit (uninitialised memory, or a huge
    allocation asked for by a few bytes of pickle).
    """
    if not isinstance(storage, torch.storage.TypedStorage):
        raise TypeError(f"expected a torch storage, got {type(storage).__name__}")
    dims, steps = tuple(size), tuple(stride)
    if len(dims) != len(steps) or offset < 0 or min((*dims, *steps), default=0) < 0:
        raise ValueError(f"invalid tensor view: size {dims}, stride {steps}, offset {offset}")
    itemsize = torch.empty(0, dtype=storage.dtype).element_size()
    available = storage._untyped_storage.nbytes() // itemsize
    last = offset + sum((d - 1) * s for d, s in zip(dims, steps, strict=True))
    if 0 not in dims and last >= available:
        raise ValueError(
            f"tensor view (size {dims}, stride {steps}, offset {offset}) reaches past its "
            f"storage of {available} elements"
        )


def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any) -> torch.Tensor:
    _check_view(storage, offset, size, stride)
    return torch._utils._rebuild_tensor(storage, offset, size, stride)


def _rebuild_tensor_v2(
    storage: Any, offset: int, size: Any, stride: Any, *rest: Any
) -> torch.Tensor:
    _check_view(storage, offset, size, stride)
    return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, *rest)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("builtins", "bytearray"): bytearray,
    # protocol 2 encodes bytes as _codecs.encode(str, "latin1")
    ("_codecs", "encode"): codecs.encode,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}
for _package in _NUMPY_PACKAGES:
    _ALLOWED[(f"{_package}.multiarray", "_reconstruct")] = _multiarray._reconstruct
    _ALLOWED[(f"{_package}.multiarray", "scalar")] = _multiarray.scalar
    # protocol 5 rebuilds arrays from out-of-band style buffers
    _ALLOWED[(f"{_package}.numeric", "_frombuffer")] = _numeric._frombuffer  # type: ignore[attr-defined]

_STORAGE_LOADER = ("torch.storage", "_load_from_bytes")
_MALFORMED = (
    pickle.UnpicklingError,
    EOFError,
    AttributeError,
    IndexError,
    KeyError,
    TypeError,
    ValueError,
    RuntimeError,
    struct.error,
)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only an allow-list of globals.

    Parameters
    ----------
    file
        A binary file positioned at the pickle.
    source
        What the bytes are (a path or URL), named in errors.
    """

    def __init__(self, file: IO[bytes], *, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        # docstring inherited
        # Protocols 0-2 name Python 2 modules (``__builtin__``); map them as pickle does.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) == _STORAGE_LOADER:
            return self._load_storage
        allowed = _ALLOWED.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafePickleError(
            f"{self.source}: refusing to unpickle global '{module}.{name}': only tensors, "
            "numpy arrays and plain containers are allowed (pass allow_unsafe=True to load "
            "a trusted file with plain pickle)"
        )

    def _load_storage(self, data: bytes) -> Any:
        try:
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as exc:
            raise UnsafePickleError(
                f"{self.source}: an embedded torch storage was refused by "
                f"torch.load(weights_only=True): {exc}"
            ) from exc


def safe_load(
    file_or_bytes: bytes | bytearray | memoryview | IO[bytes],
    *,
    allow_unsafe: bool = False,
    source: str = "<bytes>",
) -> Any:
    """Unpickle ``file_or_bytes``, admitting only tensors, arrays and plain containers.

    Parameters
    ----------
    file_or_bytes
        The pickle's bytes, or a binary file positioned at it.
    allow_unsafe
        Explicit opt-in to plain :func:`pickle.load`, which can run arbitrary code: use it
        only for files you trust.
    source
        What the bytes are (a path or URL), named in errors.

    Raises
    ------
    UnsafePickleError
        The pickle refers to a global outside the allow-list (nothing was called).
    CorruptStoreError
        The bytes are not a well-formed pickle.
    """
    stream: IO[bytes]
    if isinstance(file_or_bytes, bytes | bytearray | memoryview):
        stream = io.BytesIO(file_or_bytes)
    else:
        stream = file_or_bytes
    load: Callable[[], Any] = (
        pickle.Unpickler(stream).load
        if allow_unsafe
        else RestrictedUnpickler(stream, source=source).load
    )
    try:
        return load()
    except UnsafePickleError:
        raise
    except _MALFORMED as exc:
        raise CorruptStoreError(f"{source}: not a readable pickle: {exc!r}") from exc
