"""The restricted unpickler admits tensors and plain data, and refuses everything else."""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from rbzarr.errors import CorruptStoreError, UnsafePickleError
from rbzarr.storage.rlinf.safe_pickle import safe_load


class _SystemCall:
    """Unpickling this runs a shell command (the classic pickle exploit)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


class _Touch:
    """Unpickling this creates a file through a plain Python global (``pathlib.Path``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path, (str(self.path),))


def _payload() -> dict[str, object]:
    return {
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "bf16": torch.tensor([[1.5, -2.25]], dtype=torch.bfloat16),
        "f16": torch.tensor([0.5, 65504.0], dtype=torch.float16),
        "bool": torch.tensor([[True, False]]),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "i64": torch.tensor([-(2**62), 2**62], dtype=torch.int64),
        "view": torch.arange(12).reshape(3, 4)[:, 1:3],
        "nested": {"obs": {"image": torch.ones(2, 1, 3, dtype=torch.uint8)}},
        "size": torch.Size([3, 4]),
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "ordered": OrderedDict(a=1, b=[2, 3]),
        "set": {1, 2},
        "frozen": frozenset({"x"}),
        "complex": 1 + 2j,
        "slice": slice(1, 5, 2),
        "bytes": b"\x00\xff",
        "plain": [1, 2.5, "s", None, True, (1, 2)],
    }


def _assert_payload_equal(got: dict[str, object], want: dict[str, object]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            out = got[key]
            assert isinstance(out, torch.Tensor)
            assert out.dtype == value.dtype and out.shape == value.shape, key
            assert torch.equal(out, value), key
        elif key == "nested":
            inner = got[key]["obs"]["image"]  # type: ignore[index]
            assert torch.equal(inner, value["obs"]["image"])  # type: ignore[index]
        else:
            assert got[key] == value, key
            assert type(got[key]) is type(value), key


@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
def test_tensors_arrays_and_containers_round_trip(protocol: int) -> None:
    want = _payload()
    got = safe_load(pickle.dumps(want, protocol=protocol))
    _assert_payload_equal(got, want)


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_tensor_flags_round_trip(protocol: int) -> None:
    complex_values = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
    want = {
        "conj": complex_values.conj(),  # lazy conjugate bit
        "neg": complex_values.conj().imag,  # lazy negative bit
        "grad": torch.tensor([1.0, 2.0], requires_grad=True),
    }
    got = safe_load(pickle.dumps(want, protocol=protocol))
    assert torch.equal(got["conj"].resolve_conj(), torch.tensor([1 - 2j, -3 + 4j]))
    assert torch.equal(got["neg"].resolve_neg(), torch.tensor([-2.0, 4.0]))
    assert got["grad"].requires_grad and got["grad"].is_leaf


def test_a_tensor_with_backward_hooks_is_refused() -> None:
    crafted = _View((3,), (1,), hooks=OrderedDict(hook=1))
    with pytest.raises(CorruptStoreError, match="backward hooks"):
        safe_load(pickle.dumps(crafted))


def test_accepts_a_binary_file_object() -> None:
    want = {"x": torch.arange(3)}
    got = safe_load(io.BytesIO(pickle.dumps(want)))
    assert torch.equal(got["x"], torch.arange(3))


def test_os_system_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps({"rewards": torch.zeros(2, 2), "x": _SystemCall(f"touch {marker}")})
    with pytest.raises(UnsafePickleError) as info:
        safe_load(data, source="evil.pkl")
    message = str(info.value)
    assert "evil.pkl" in message
    assert f"'{os.system.__module__}.system'" in message
    assert not marker.exists()


def test_any_unlisted_global_is_refused(tmp_path: Path) -> None:
    data = pickle.dumps([_Touch(tmp_path / "made")])
    with pytest.raises(UnsafePickleError, match=r"'pathlib\.\w*Path'"):
        safe_load(data, source="x.pkl")
    for module, name in [("builtins", "eval"), ("builtins", "getattr"), ("torch", "load")]:
        crafted = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"."
        with pytest.raises(UnsafePickleError, match=rf"'{module}\.{name}'"):
            safe_load(crafted)


def test_embedded_storage_is_loaded_with_weights_only(tmp_path: Path) -> None:
    """``torch.storage._load_from_bytes`` must not reach ``torch.load(weights_only=False)``."""
    marker = tmp_path / "pwned"
    inner = io.BytesIO()
    torch.save(_SystemCall(f"touch {marker}"), inner, _use_new_zipfile_serialization=False)
    crafted = pickle.dumps(_StorageBytes(inner.getvalue()), protocol=2)
    with pytest.raises(UnsafePickleError, match="embedded torch storage"):
        safe_load(crafted, source="storage.pkl")
    assert not marker.exists()


class _StorageBytes:
    """Pickles as ``torch.storage._load_from_bytes(data)``, like a real tensor storage."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        return (torch.storage._load_from_bytes, (self.data,))


def test_allow_unsafe_uses_plain_pickle() -> None:
    data = pickle.dumps({"p": Path("/a/b")})
    assert safe_load(data, allow_unsafe=True) == {"p": Path("/a/b")}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage",
        pickle.dumps([1, 2, 3])[:-3],
        b"\x80\x04\x95" + (2**63).to_bytes(8, "little") + b"K\x01.",  # a FRAME past 2**63-1
    ],
)
def test_malformed_bytes_raise_corrupt_store_error(data: bytes) -> None:
    with pytest.raises(CorruptStoreError, match=r"bad\.pkl: not a readable pickle"):
        safe_load(data, source="bad.pkl")


class _View:
    """Pickles as a tensor view of ``size`` over a 4-element storage."""

    def __init__(
        self,
        size: tuple[int, ...],
        stride: tuple[int, ...],
        offset: int = 0,
        hooks: OrderedDict[str, int] | None = None,
    ) -> None:
        self.args = (offset, size, stride)
        self.hooks = hooks or OrderedDict()

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        storage = torch.TypedStorage(
            wrap_storage=torch.arange(4.0).untyped_storage(), dtype=torch.float32, _internal=True
        )
        return (torch._utils._rebuild_tensor_v2, (storage, *self.args, False, self.hooks))


@pytest.mark.parametrize(
    ("size", "stride", "offset"),
    [
        ((5,), (1,), 0),
        ((10**12,), (1,), 0),
        ((2, 2), (2, 1), 1),
        ((2,), (-1,), 1),
        ((1,), (1,), -1),
    ],
)
def test_tensor_views_past_their_storage_are_refused(
    size: tuple[int, ...], stride: tuple[int, ...], offset: int
) -> None:
    with pytest.raises(CorruptStoreError, match=r"view\.pkl: .*tensor view"):
        safe_load(pickle.dumps(_View(size, stride, offset)), source="view.pkl")


def test_tensor_views_inside_their_storage_load() -> None:
    got = safe_load(pickle.dumps([_View((2, 2), (1, 2), 0), _View((0,), (1,), 4)]))
    assert got[0].tolist() == [[0.0, 2.0], [1.0, 3.0]]
    assert got[1].shape == (0,)


@pytest.mark.parametrize(
    "value",
    [np.arange(3), np.float32(1.5), np.dtype("V8"), bytearray(b"ab")],
    ids=["ndarray", "scalar", "dtype", "bytearray"],
)
def test_numpy_builders_and_bytearray_are_refused(value: object) -> None:
    """numpy's ``_reconstruct``, ``scalar`` and ``dtype`` setstate can forge pointers; rbzarr
    and RLinf never pickle them (nor ``bytearray``, which can ask for any size)."""
    with pytest.raises(UnsafePickleError, match=r"refusing to unpickle global '(numpy|builtins)"):
        safe_load(pickle.dumps({"rewards": value}), source="np.pkl")


@pytest.mark.parametrize(("size", "stride"), [((10**9,), (0,)), ((2, 3), (1, 1)), ((4, 4), (0, 1))])
def test_zero_stride_and_overlapping_views_are_refused(
    size: tuple[int, ...], stride: tuple[int, ...]
) -> None:
    with pytest.raises(CorruptStoreError, match=r"view\.pkl: .*tensor view"):
        safe_load(pickle.dumps(_View(size, stride)), source="view.pkl")


def test_an_embedded_storage_declaring_more_than_it_holds_is_refused() -> None:
    data = pickle.dumps({"rewards": torch.zeros(4)}, protocol=2)
    # The element count after the keys (little-endian int64 4) becomes 2**30.
    forged = data.replace(b"\x04\x00\x00\x00\x00\x00\x00\x00", b"\x00\x00\x00\x40\x00\x00\x00\x00")
    assert forged != data
    with pytest.raises(CorruptStoreError, match="embedded torch storage declares"):
        safe_load(forged, source="big.pkl")


@pytest.mark.parametrize(
    ("opcode", "width"),
    [(b"\x8e", 8), (b"\x8d", 8), (b"\x96", 8), (b"B", 4), (b"X", 4)],
    ids=["BINBYTES8", "BINUNICODE8", "BYTEARRAY8", "BINBYTES", "BINUNICODE"],
)
def test_a_length_past_the_end_is_refused_before_anything_is_allocated(
    opcode: bytes, width: int
) -> None:
    """A counted value declaring more bytes than follow it (the unpickler would allocate
    all of them first: a ``MemoryError``, or gigabytes for a few bytes of file)."""
    declared = 2 ** (8 * width - 2)
    crafted = b"\x80\x04}X\x07\x00\x00\x00rewards" + opcode + declared.to_bytes(width, "little")
    with pytest.raises(CorruptStoreError, match=rf"big\.pkl: .*declares {declared} bytes"):
        safe_load(crafted + b"xxs.", source="big.pkl")


def test_a_huge_length_inside_an_embedded_storage_is_refused() -> None:
    inner = io.BytesIO()
    torch.save(torch.zeros(1).untyped_storage(), inner, _use_new_zipfile_serialization=False)
    legacy = inner.getvalue()
    # the first header pickle (the magic number) becomes a BINBYTES8 of 2**62 bytes
    forged = b"\x80\x04\x8e" + (2**62).to_bytes(8, "little") + legacy[3:]
    with pytest.raises(CorruptStoreError, match=r"storage\.pkl: .*declares 4611686018427387904"):
        safe_load(pickle.dumps(_StorageBytes(forged), protocol=2), source="storage.pkl")
