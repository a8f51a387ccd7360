"""Codec specs: the short names a key's codec is chosen by, and the codecs they stand for.

API (what ``layout_options={"codecs": {key: spec}}`` and the tools take)::

    parse_codec(spec) -> Codec
        spec: "raw" | "zstd" | "zstd:<level>" | "zstd:<level>+checksum" | "lossless"
              | "qoi" | "png" | "png:<level>" | "jpegxl-lossless" | "jpegxl-lossless:<effort>"
              | "jpeg:<quality>" | "jpegxl:<quality>" | None (raw)
              | a zarr codec object (ZstdCodec, BloscCodec..) | a Codec.
        Unknown or malformed specs raise ValueError naming the spec.
    parse_codecs({key: spec}) -> {key: Codec}      keys are flat ("curr_obs/image") or
                                                    "default" (every key not named)
    choose_codec(codecs, key, shape, dtype) -> Codec   the concrete codec of one array:
        codecs[key], else codecs["default"], else "lossless" for image-like keys, else raw;
        "lossless" resolved for the key's shape.  A codec that cannot encode the key is
        InvalidCodecError; an image codec without imagecodecs is CodecUnavailableError.
    image_layout(shape, dtype) -> "hwc" | "chw" | None     image-like: uint8 [T, B, H, W, C]
                                                          or [T, B, C, H, W], C in 1, 3, 4
    Codec             one small class per kind (:mod:`rbzarr.storage.zarr.codec`): Raw,
                      Zstd, ZarrCodec here; Lossless, Qoi, Png, JpegXlLossless, Jpeg,
                      JpegXl in :mod:`rbzarr.storage.zarr.image_codecs`
    Codec.text        canonical spec ("qoi", "jpeg:95", "zstd:1"), what the store records
    Codec.kind        the array kind the layout description records ("mapped", "chunked",
                      "image", "zarr")
    Codec.lossy       whether decoded frames may differ from the written ones
    Codec.is_image    whether it encodes one frame at a time (imagecodecs)
    Codec.encode(data, inner, layout) -> shard parts;  Codec.decoder(frame, layout)
    Codec.shard_codecs(dtype, layout) -> the Zarr v3 codecs inside the shard
    Codec.encode_frame(frame HWC uint8) -> bytes;  Codec.decode_frame(data, out HWC) -> out
                      (never allocates from the stream's header: a bounded decode)
    stored_codec(kind, text, where) -> Codec   the codec of a stored array's description
    CANDIDATES        the specs ``rbzarr codecs`` tries, lossless first
    IMAGE_CODECS      the image codec names (each decodes only into its declared frame)
    decode_into(numcodec, name, data, out) -> out   the one image decode (bounded by out)
    psnr(a, b) -> float   in dB over whole arrays (inf when identical)
    require_images(what)  raises CodecUnavailableError (an ImportError) naming imagecodecs
                          when this process cannot import it
    is_known(text) -> bool;  unknown_codec(where, codec) -> CodecUnavailableError
                          a store's codec this rbzarr does not know (not damage)

Image codecs come from ``imagecodecs`` (a dependency of rbzarr) through its numcodecs
classes, recorded in each array's ``zarr.json`` as ``numcodecs.imagecodecs_<name>`` inside the
shard's codec chain; :mod:`rbzarr.storage.zarr.zarr_codecs` registers them with zarr, so plain
``zarr.open_group`` decodes them once rbzarr is imported (or installed: entry points).
``"jpeg:<q>"`` keeps full 4:4:4 chroma (4:2:0 halves the colour resolution: measured 3-4 dB
lower PSNR on the same frames).  ``"lossless"`` is QOI for 3- or 4-channel frames and PNG
(level 1) for others: measured on MuJoCo renders and natural photos it compresses like PNG and
JPEG-XL effort 1 (0.21 / 0.59 of raw per frame) and decodes 5-10x faster than either (14 k /
7 k frames of 128x128 a second on one core) -- see docs/images.md.  Lossy is never a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numcodecs import zstd
from zarr.codecs import BytesCodec, ZstdCodec

from rbzarr.errors import CodecUnavailableError, CorruptStoreError
from rbzarr.storage.io import thread_pool
from rbzarr.storage.zarr.codec import Codec, Decoder, ParamCodec
from rbzarr.storage.zarr.image_codecs import (
    IMAGES_EXTRA,
    Jpeg,
    JpegXl,
    JpegXlLossless,
    Lossless,
    Png,
    Qoi,
    decode_into,
    image_layout,
    require_images,
)

__all__ = [
    "CANDIDATES",
    "IMAGES_EXTRA",
    "IMAGE_CODECS",
    "INNER_CHUNK_BYTES",
    "RAW",
    "Codec",
    "Raw",
    "ZarrCodec",
    "Zstd",
    "choose_codec",
    "decode_into",
    "image_layout",
    "is_known",
    "parse_codec",
    "parse_codecs",
    "psnr",
    "require_images",
    "stored_codec",
    "unknown_codec",
    "zstd_into",
]

# What `rbzarr codecs` tries by default: lossless first, then lossy.
CANDIDATES = ("raw", "zstd:1", "qoi", "png:1", "jpegxl-lossless:1", "jpeg:95", "jpegxl:90")
# A zstd array packs this many bytes per inner chunk (at least one row).
INNER_CHUNK_BYTES = 64 * 2**10
# Arrays at least this large are compressed on the worker pool (zstd releases the GIL).
THREADED_BYTES = 1 << 20


@dataclass(frozen=True)
class Raw(Codec):
    """``"raw"``: the array's own bytes, one inner chunk (read in place)."""

    name: ClassVar[str] = "raw"
    kind: ClassVar[str] = "mapped"
    in_place: ClassVar[bool] = True

    def inner(self, shape: Sequence[int], dtype: Any) -> tuple[int, ...]:
        # docstring inherited
        return tuple(int(d) for d in shape)

    def encode(self, data: np.ndarray, inner: tuple[int, ...], layout: str) -> list[Any]:
        # docstring inherited
        return [data.reshape(-1).view(np.uint8)]

    def decoder(self, frame_shape: tuple[int, ...], layout: str) -> Decoder | None:
        # docstring inherited
        return None

    def shard_codecs(self, dtype: np.dtype[Any], layout: str) -> tuple[Any, ...]:
        # docstring inherited
        return (BytesCodec(endian="little" if dtype.itemsize > 1 else None),)

    def described(self, layout: str) -> dict[str, Any]:
        # docstring inherited
        return {}

    def zarr_compressor(self) -> Any:
        # docstring inherited
        return None

    def encode_frame(self, frame: np.ndarray) -> bytes:
        # docstring inherited
        return frame.tobytes()

    def decode_frame(self, data: bytes | memoryview, out: np.ndarray) -> np.ndarray:
        # docstring inherited
        out[...] = np.frombuffer(data, dtype=out.dtype).reshape(out.shape)
        return out


# Stored as it is (read in place).
RAW = Raw()


@dataclass(frozen=True)
class Zstd(ParamCodec):
    """``"zstd:<level>"`` (``+checksum``): zstd inner chunks of ``k`` steps of one env."""

    name: ClassVar[str] = "zstd"
    kind: ClassVar[str] = "chunked"
    params: ClassVar[tuple[int, int] | None] = (-131072, 22)
    checksum: bool = False

    @property
    def text(self) -> str:
        # docstring inherited
        return f"zstd:{self.param}" + ("+checksum" if self.checksum else "")

    def inner(self, shape: Sequence[int], dtype: Any) -> tuple[int, ...]:
        """``(k, 1, *trailing)`` (``(k,)`` for a 1-D array), ``k`` the largest divisor of the
        row count with ``k`` rows in at most :data:`INNER_CHUNK_BYTES`."""
        rows = int(shape[0])
        row_bytes = math.prod(shape[2:]) * np.dtype(dtype).itemsize
        most = max(1, min(rows, INNER_CHUNK_BYTES // row_bytes))
        steps = max(k for k in range(1, most + 1) if rows % k == 0)
        inner = (steps, 1, *shape[2:]) if len(shape) >= 2 else (steps,)
        return tuple(int(d) for d in inner)

    def encode(self, data: np.ndarray, inner: tuple[int, ...], layout: str) -> list[Any]:
        """Every inner chunk compressed (large arrays on the worker pool), each from its view
        of ``data``: a strided one is made contiguous alone (a chunk-sized copy, never one
        of the whole array)."""
        chunks = _inner_chunks(data, inner)
        return thread_pool.run_all(self._encode_chunk, chunks, data.nbytes >= THREADED_BYTES)

    def _encode_chunk(self, chunk: np.ndarray) -> bytes:
        return self.encode_frame(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))

    def decoder(self, frame_shape: tuple[int, ...], layout: str) -> Decoder | None:
        # docstring inherited
        return zstd_into

    def shard_codecs(self, dtype: np.dtype[Any], layout: str) -> tuple[Any, ...]:
        # docstring inherited
        return (
            BytesCodec(endian="little" if dtype.itemsize > 1 else None),
            ZstdCodec(level=self.param, checksum=self.checksum),
        )

    def zarr_compressor(self) -> Any:
        # docstring inherited
        return ZstdCodec(level=self.param, checksum=self.checksum)

    def encode_frame(self, frame: np.ndarray) -> bytes:
        # docstring inherited
        return bytes(zstd.compress(frame, self.param, self.checksum))

    def decode_frame(self, data: bytes | memoryview, out: np.ndarray) -> np.ndarray:
        # docstring inherited
        zstd.decompress(data, out)
        return out


def zstd_into(data: bytes | memoryview, target: np.ndarray) -> None:
    """One zstd inner chunk decoded into its target."""
    zstd.decompress(data, target)


def _inner_chunks(data: np.ndarray, inner: tuple[int, ...]) -> list[np.ndarray]:
    """Views of the inner chunks of ``data`` in C order of the grid (not copied: one
    spanning several environments is strided).

    Inner chunks are ``(k,)`` for a 1-D array, else ``(k, 1, *trailing)``.
    """
    k = inner[0]
    rows = data.shape[0]
    if data.ndim == 1:
        return list(data.reshape(rows // k, k))
    envs = data.shape[1]
    blocks = data.reshape(rows // k, k, envs, -1)
    return [blocks[i, :, env] for i in range(rows // k) for env in range(envs)]


@dataclass(frozen=True)
class ZarrCodec(Codec):
    """A zarr codec object the caller gave (``BloscCodec``...): zarr writes and reads the
    array through its own pipeline."""

    name: ClassVar[str] = "zarr"
    kind: ClassVar[str] = "zarr"
    given: Any = None

    @property
    def text(self) -> str:
        """The object as text: ``blosc(cname=lz4, ...)``."""
        document = self.given.to_dict()
        config = document.get("configuration") or {}
        args = ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
        return f"{document.get('name')}({args})"

    def inner(self, shape: Sequence[int], dtype: Any) -> tuple[int, ...]:
        """None: zarr chunks the array itself."""
        return ()

    def zarr_compressor(self) -> Any:
        # docstring inherited
        return self.given


# The codec classes by spec name.
_BY_NAME: dict[str, type[Codec]] = {
    cls.name: cls for cls in (Raw, Zstd, Lossless, Qoi, Png, JpegXlLossless, Jpeg, JpegXl)
}
# The image codec names (each decodes only into its declared frame).
IMAGE_CODECS = tuple(name for name, cls in _BY_NAME.items() if cls.is_image)


def is_known(text: str) -> bool:
    """Whether spec ``text`` names a codec this rbzarr knows (its parameter aside)."""
    return text.strip().lower().partition(":")[0].removesuffix("+checksum") in _BY_NAME


def unknown_codec(where: str, codec: str) -> CodecUnavailableError:
    """The error of data stored with a codec this process does not know (``codec``, as the
    store names it): a newer rbzarr or another package wrote it; it is not damaged."""
    return CodecUnavailableError(
        f"{where}: codec {codec!r} is not one this Python knows (a newer rbzarr, or a package "
        "not installed here, wrote it): upgrade rbzarr or install the codec's package to "
        "read it; the data is not damaged"
    )


def parse_codec(spec: Any) -> Codec:
    """The :class:`Codec` of one spec (see the module docs).

    Raises
    ------
    ValueError
        ``spec`` is not a known codec name, its parameter is not an integer in range, or a
        lossy codec is given without its quality.
    """
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        return _from_object(spec)
    text = spec.strip().lower()
    if text.startswith("zstd") and text.endswith("+checksum"):
        plain = parse_codec(text.removesuffix("+checksum"))
        assert isinstance(plain, Zstd)
        return Zstd(plain.param, checksum=True)
    name, sep, raw_param = text.partition(":")
    cls = _BY_NAME.get(name)
    if cls is None:
        known = ", ".join(repr(n) for n in _BY_NAME)
        raise ValueError(f"codec {spec!r}: unknown name {name!r} (known: {known})")
    if not sep:
        if cls.needs_param:
            raise ValueError(f"codec {spec!r}: give the quality, e.g. '{name}:95'")
        return cls()
    if cls.params is None:
        raise ValueError(f"codec {spec!r}: {name!r} takes no parameter")
    try:
        param = int(raw_param)
    except ValueError:
        raise ValueError(f"codec {spec!r}: the parameter must be an integer") from None
    low, high = cls.params
    if not low <= param <= high:
        raise ValueError(f"codec {spec!r}: {name} takes {low}..{high}, got {param}")
    return cls.with_param(param)


def _from_object(spec: Any) -> Codec:
    """The :class:`Codec` of ``None`` (raw) or a zarr codec object."""
    if spec is None:
        return RAW
    if isinstance(spec, ZstdCodec):
        return Zstd(int(spec.level), bool(spec.checksum))
    if hasattr(spec, "to_dict"):
        return ZarrCodec(spec)
    raise ValueError(f"codec {spec!r}: expected a spec string, a zarr codec or None")


def parse_codecs(codecs: Mapping[str, Any] | None) -> dict[str, Codec]:
    """Every spec of a ``{key: spec}`` mapping parsed (``"default"`` included)."""
    if codecs is None:
        return {}
    if not isinstance(codecs, Mapping):
        raise ValueError(f"codecs must map keys to codec specs, got {type(codecs).__name__}")
    return {str(key): parse_codec(spec) for key, spec in codecs.items()}


def choose_codec(codecs: Mapping[str, Codec], key: str, shape: Sequence[int], dtype: Any) -> Codec:
    """The concrete codec of array ``key`` (see the module docs).

    Raises
    ------
    InvalidCodecError
        An image codec is chosen for an array that is not image-like (a ``ValueError``).
    CodecUnavailableError
        An image codec is chosen (image-like keys default to one) and imagecodecs is
        missing (an ``ImportError``).
    """
    chosen = codecs.get(key, codecs.get("default"))
    layout = image_layout(shape, dtype) if shape and 0 not in shape else None
    if chosen is None:
        if layout is None:
            return RAW
        chosen = Lossless()
    return chosen.for_array(key, shape, dtype, layout, key in codecs) or RAW


# The codec text a description of each stored kind implies when it names none.
_STORED_DEFAULT = {"mapped": "raw", "chunked": "zstd"}


def stored_codec(kind: str, text: str, where: str) -> Codec:
    """The codec of an array rbzarr stored itself, from its layout description's ``kind``
    and ``codec`` (empty: the kind's own).

    Raises
    ------
    CodecUnavailableError
        The description names a codec this rbzarr does not know (not damage).
    CorruptStoreError
        The codec is malformed, or is not one of an array of ``kind``.
    """
    text = text or _STORED_DEFAULT.get(kind, "")
    if not is_known(text):
        raise unknown_codec(where, text)
    try:
        codec = parse_codec(text)
    except ValueError as exc:
        raise CorruptStoreError(f"{where}: {exc}") from exc
    if codec.kind != kind:
        raise CorruptStoreError(f"{where}: {kind} arrays are not stored with {text!r}")
    return codec


def psnr(original: np.ndarray, decoded: np.ndarray) -> float:
    """Peak signal-to-noise ratio of uint8 ``decoded`` against ``original``, in dB over the
    whole arrays (``inf`` when identical)."""
    error = np.subtract(original, decoded, dtype=np.float64).reshape(-1)  # one temporary
    mse = float(error @ error) / error.size if error.size else 0.0
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
