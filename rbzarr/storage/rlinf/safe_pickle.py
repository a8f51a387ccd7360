"""Loading pickles without running arbitrary code.

:func:`safe_load` unpickles with a :class:`RestrictedUnpickler` that resolves only the
globals that pickled tensors and plain containers need (what rbzarr and RLinf write).
Anything else (``os.system``, ``builtins.eval``, numpy's array and dtype builders, a user
class, ...) raises :class:`~rbzarr.errors.UnsafePickleError` naming ``module.global`` and the
source before it is called.

``pickle.dumps`` of a tensor refers to ``torch.storage._load_from_bytes``, which runs
``torch.load(weights_only=False)`` on the embedded storage: it is never resolved as is, but
replaced by a reader of that embedded (legacy ``torch.save``) format that admits one typed
storage whose declared size matches the bytes that follow.  Tensor views are checked before
they are built: inside their storage, no zero or negative strides over more than one
element, no more elements than the storage holds (no overlapping views).
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import IO, Any

import torch

from rbzarr.errors import CorruptStoreError, UnsafePickleError

__all__ = ["RestrictedUnpickler", "safe_load"]

# Protocols 0-2 name Python 2's builtins module; the allow-list needs no other mapping.
_PYTHON2_MODULES = {"__builtin__": "builtins"}


def _check_view(available: int, offset: int, size: Any, stride: Any) -> None:
    """Refuse (ValueError) a tensor view reaching past the ``available`` elements of its storage.

    torch would otherwise grow the storage to fit (uninitialised memory, or a huge allocation
    asked for by a few bytes of pickle).
    """
    dims, steps = tuple(size), tuple(stride)
    if (
        len(dims) != len(steps)
        or not all(_is_count(n) for n in (offset, *dims, *steps))
        or any(s == 0 and d > 1 for d, s in zip(dims, steps, strict=True))
    ):
        raise ValueError(f"invalid tensor view: size {dims}, stride {steps}, offset {offset}")
    if 0 in dims:
        return
    last = offset + sum((d - 1) * s for d, s in zip(dims, steps, strict=True))
    elements = 1
    for d in dims:
        elements *= d
    if last >= available or elements > available:
        raise ValueError(
            f"tensor view (size {dims}, stride {steps}, offset {offset}) reaches past its "
            f"storage of {available} elements"
        )


def _check_declared_sizes(stream: IO[bytes]) -> None:
    """Refuse (ValueError) a pickle, from ``stream``'s position to its STOP, declaring more
    bytes for a value than follow it; the position is kept.

    The unpickler allocates a counted value (``BINBYTES8``, ``BINUNICODE``, ...) at its
    declared length before reading it: a few bytes could ask for any amount of memory.  The
    scan reads the opcodes and lengths only, never the values' bytes.
    """
    start = stream.tell()
    end = stream.seek(0, io.SEEK_END)
    stream.seek(start)
    try:
        while True:
            code = stream.read(1)
            op = _OPCODES.get(code.decode("latin-1"))
            if op is None:
                raise ValueError(f"no pickle opcode {code!r} at byte {stream.tell() - 1}")
            if op.name == "STOP":
                return
            if op.arg is None:
                continue
            if op.arg.n >= 0:
                stream.seek(op.arg.n, io.SEEK_CUR)
            elif op.arg.n == pickletools.UP_TO_NEWLINE:
                op.arg.reader(stream)  # protocol 0's text lines (a line, or two for GLOBAL)
            else:
                width, signed = _COUNTED[op.arg.n]
                length = int.from_bytes(stream.read(width), "little", signed=signed)
                left = end - stream.tell()
                if not 0 <= length <= left:
                    raise ValueError(
                        f"{op.name} at byte {stream.tell() - width - 1} declares {length} "
                        f"bytes, but {left} follow"
                    )
                stream.seek(length, io.SEEK_CUR)
    finally:
        stream.seek(start)


_OPCODES = {op.code: op for op in pickletools.opcodes}
# The width and signedness of a counted value's length, by pickletools' kind of argument.
_COUNTED = {
    pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, False),
}


def _is_count(value: Any) -> bool:
    """Whether ``value`` is a non-negative int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for bytes: a str to latin-1 bytes only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise ValueError(f"_codecs.encode is admitted for latin-1 str only, got {encoding!r}")
    return text.encode("latin-1")


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
    # protocol 2 encodes bytes as _codecs.encode(str, "latin1")
    ("_codecs", "encode"): _encode,
}

_STORAGE_LOADER = ("torch.storage", "_load_from_bytes")
# The legacy torch.save format of an embedded storage: three header pickles (magic number,
# protocol, system info), the storage's persistent id, its keys, then per key an int64
# element count and the raw bytes.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_COUNT = struct.Struct("<q")
# torch's legacy storage classes, by the name the format refers to them with.
_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}
_MALFORMED = (
    pickle.UnpicklingError,
    EOFError,
    AttributeError,
    IndexError,
    KeyError,
    TypeError,
    ValueError,
    RuntimeError,
    OverflowError,  # a length past what the platform takes (a FRAME of 2**63 bytes)
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
            f"{self.source}: refusing to unpickle global '{module}.{name}': only tensors "
            "and plain containers are allowed (pass allow_unsafe=True to load a trusted file "
            "with plain pickle)"
        )

    def _load_storage(self, data: Any) -> torch.storage.TypedStorage:
        """The typed storage embedded as ``data``: legacy ``torch.save`` bytes of one storage."""
        if not isinstance(data, bytes):
            raise TypeError(f"an embedded torch storage must be bytes, got {type(data).__name__}")
        stream = io.BytesIO(data)
        header = [_StorageHeader(stream, self.source).load() for _ in range(3)]
        if header[0] != _LEGACY_MAGIC or header[1] != _LEGACY_PROTOCOL:
            raise ValueError("an embedded torch storage is not in torch's legacy format")
        if not isinstance(header[2], dict) or header[2].get("little_endian") is not True:
            raise ValueError("an embedded torch storage is not little-endian")
        found = _StorageHeader(stream, self.source)
        found.load()
        keys = _StorageHeader(stream, self.source).load()
        if len(found.storages) != 1 or keys != [found.storages[0][0]]:
            raise ValueError("an embedded torch storage must hold exactly one storage")
        _, dtype, count = found.storages[0]
        (stored,) = _COUNT.unpack(stream.read(_COUNT.size))
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        start = stream.tell()
        if stored != count or start + nbytes != len(data):
            raise ValueError(
                f"an embedded torch storage declares {count} elements ({nbytes} bytes) but "
                f"holds {len(data) - start} bytes"
            )
        raw = torch.frombuffer(bytearray(data[start:]), dtype=torch.uint8) if nbytes else None
        untyped = torch.UntypedStorage(0) if raw is None else raw.untyped_storage()
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


class _StorageHeader(pickle.Unpickler):
    """One pickle of an embedded storage's legacy format: plain values, the storage classes
    (as their dtypes) and persistent storage ids (recorded in :attr:`storages`)."""

    def __init__(self, file: IO[bytes], source: str) -> None:
        super().__init__(file)
        self._stream = file
        self.source = source
        self.storages: list[tuple[str, torch.dtype, int]] = []

    def load(self) -> Any:
        """The next pickle of the stream, its declared sizes checked first."""
        _check_declared_sizes(self._stream)
        return super().load()

    def find_class(self, module: str, name: str) -> Any:
        """A legacy storage class's dtype, else UnsafePickleError."""
        dtype = _STORAGE_DTYPES.get(name) if module == "torch" else None
        if dtype is not None:
            return dtype
        raise UnsafePickleError(
            f"{self.source}: an embedded torch storage refers to global '{module}.{name}'; "
            "only torch's storage types are allowed"
        )

    def persistent_load(self, pid: Any) -> None:
        """Record a storage's ``(key, dtype, element count)``; anything else is refused."""
        if not (
            isinstance(pid, tuple)
            and len(pid) in (5, 6)
            and pid[0] == "storage"
            and isinstance(pid[1], torch.dtype)
            and isinstance(pid[2], str)
            and pid[3] == "cpu"
            and _is_count(pid[4])
            and pid[5:] in ((), (None,))
        ):
            raise ValueError(f"an embedded torch storage has an unexpected id {pid!r}")
        self.storages.append((pid[2], pid[1], pid[4]))


def safe_load(
    file_or_bytes: bytes | bytearray | memoryview | IO[bytes],
    *,
    allow_unsafe: bool = False,
    source: str = "<bytes>",
) -> Any:
    """Unpickle ``file_or_bytes``, admitting only tensors and plain containers.

    ``allow_unsafe`` is the explicit opt-in to plain :func:`pickle.load`, which can run arbitrary
    code (trusted files only).  A refused global raises :class:`UnsafePickleError` before
    anything is called; bytes that are not a well-formed pickle raise :class:`CorruptStoreError`.
    """
    stream: IO[bytes]
    if isinstance(file_or_bytes, bytes | bytearray | memoryview):
        stream = io.BytesIO(file_or_bytes)
    elif file_or_bytes.seekable():
        stream = file_or_bytes
    else:
        stream = io.BytesIO(file_or_bytes.read())
    load: Callable[[], Any] = (
        pickle.Unpickler(stream).load
        if allow_unsafe
        else RestrictedUnpickler(stream, source=source).load
    )
    try:
        _check_declared_sizes(stream)
        return load()
    except UnsafePickleError:
        raise
    except _MALFORMED as exc:
        raise CorruptStoreError(f"{source}: not a readable pickle: {exc!r}") from exc
