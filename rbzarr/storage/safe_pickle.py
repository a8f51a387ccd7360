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

import codecs
import io
import pickle
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import torch

from rbzarr.errors import CorruptStoreError, UnsafePickleError

__all__ = ["RestrictedUnpickler", "safe_load"]

# numpy moved its internals from numpy.core to numpy._core in 2.0; pickles name either.
_NUMPY_PACKAGES = ("numpy.core", "numpy._core")
# Protocols 0-2 name Python 2's builtins module; the allow-list needs no other mapping.
_PYTHON2_MODULES = {"__builtin__": "builtins"}


def _check_view(available: int, offset: int, size: Any, stride: Any) -> None:
    """Refuse (ValueError) a tensor view reaching past the ``available`` elements of its storage.

    torch would otherwise grow the storage to fit (uninitialised memory, or a huge allocation
    asked for by a few bytes of pickle).
    """
    dims, steps = tuple(size), tuple(stride)
    if len(dims) != len(steps) or offset < 0 or min((*dims, *steps), default=0) < 0:
        raise ValueError(f"invalid tensor view: size {dims}, stride {steps}, offset {offset}")
    last = offset + sum((d - 1) * s for d, s in zip(dims, steps, strict=True))
    if 0 not in dims and last >= available:
        raise ValueError(
            f"tensor view (size {dims}, stride {steps}, offset {offset}) reaches past its "
            f"storage of {available} elements"
        )


def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any) -> torch.Tensor:
    """A CPU tensor viewing ``storage`` as the pickle's ``_rebuild_tensor`` says (view checked)."""
    if not isinstance(storage, torch.storage.TypedStorage):
        raise TypeError(f"expected a torch storage, got {type(storage).__name__}")
    # Read through a tensor over all of it: TypedStorage's own methods are deprecated.
    tensor = torch.empty((0,), dtype=storage.dtype, device="cpu").set_(storage)
    _check_view(tensor.numel(), offset, size, stride)
    return tensor.set_(storage, offset, tuple(size), tuple(stride))


def _rebuild_tensor_v2(
    storage: Any,
    offset: int,
    size: Any,
    stride: Any,
    requires_grad: bool,
    backward_hooks: Any,
    metadata: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``Tensor.__reduce_ex__``'s tensor: a checked view and its conj/neg bits; hooks refused."""
    if backward_hooks:
        raise ValueError("a pickled tensor with backward hooks")
    flags = metadata or {}
    unknown = set(flags) - {"conj", "neg"}
    if unknown:
        raise ValueError(f"a pickled tensor with unsupported metadata {sorted(unknown)}")
    tensor = _rebuild_tensor(storage, offset, size, stride)
    if flags.get("conj"):
        tensor = tensor.conj()
    if flags.get("neg"):
        tensor = tensor.neg()
    tensor.requires_grad = bool(requires_grad)
    return tensor


def _new_array(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """The empty ``numpy.ndarray`` that ``ndarray.__reduce__`` starts from (no subclass allowed)."""
    if subtype is not np.ndarray:
        raise TypeError(f"expected numpy.ndarray, got {subtype!r}")
    return np.ndarray(shape, dtype)


def _array_from_buffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """An array of protocol 5's out-of-band form: ``buffer`` read as ``dtype``, reshaped."""
    return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order)


def _scalar(dtype: np.dtype, data: Any) -> Any:
    """A numpy scalar from its pickled raw bytes (an object scalar is its object)."""
    if dtype.hasobject:
        return data
    raw = data.encode("latin1") if isinstance(data, str) else bytes(data)
    if len(raw) != dtype.itemsize:
        raise ValueError(f"a {dtype} scalar needs {dtype.itemsize} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=dtype)[0]


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
    _ALLOWED[(f"{_package}.multiarray", "_reconstruct")] = _new_array
    _ALLOWED[(f"{_package}.multiarray", "scalar")] = _scalar
    # protocol 5 rebuilds arrays from out-of-band style buffers
    _ALLOWED[(f"{_package}.numeric", "_frombuffer")] = _array_from_buffer

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
    """An unpickler resolving only an allow-list of globals; ``source`` names the bytes."""

    def __init__(self, file: IO[bytes], *, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        """The allowed global ``module.name`` (builders checked), else UnsafePickleError."""
        module = _PYTHON2_MODULES.get(module, module)
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

    ``allow_unsafe`` is the explicit opt-in to plain :func:`pickle.load`, which can run arbitrary
    code (trusted files only).  A refused global raises :class:`UnsafePickleError` before
    anything is called; bytes that are not a well-formed pickle raise :class:`CorruptStoreError`.
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
