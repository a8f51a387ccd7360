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
    Codec.text        canonical spec ("qoi", "jpeg:95", "zstd:1"), what the store records
    Codec.lossy       whether decoded frames may differ from the written ones
    Codec.is_image    whether it encodes one frame at a time (imagecodecs)
    Codec.encode_frame(frame HWC uint8) -> bytes;  Codec.decode_frame(data, out HWC) -> out
                      (never allocates from the stream's header: a bounded decode)
    Codec.zarr_codecs(layout) -> the Zarr v3 codecs of one frame's inner chunk
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
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zarr.codecs import ZstdCodec

from rbzarr.errors import CodecUnavailableError, InvalidCodecError

__all__ = [
    "CANDIDATES",
    "IMAGES_EXTRA",
    "IMAGE_CODECS",
    "RAW",
    "Codec",
    "choose_codec",
    "decode_into",
    "image_layout",
    "is_known",
    "parse_codec",
    "parse_codecs",
    "psnr",
    "require_images",
    "unknown_codec",
]

IMAGES_EXTRA = "rbzarr[images]"
# What `rbzarr codecs` tries by default: lossless first, then lossy.
CANDIDATES = ("raw", "zstd:1", "qoi", "png:1", "jpegxl-lossless:1", "jpeg:95", "jpegxl:90")
# Names a spec may start with, and whether a ":<int>" parameter is required / its default.
_DEFAULT_PARAM: dict[str, int | None] = {
    "raw": None,
    "zstd": 1,
    "lossless": None,
    "qoi": None,
    "png": 1,
    "jpegxl-lossless": 1,
    "jpeg": None,  # quality required
    "jpegxl": None,  # quality required
}
_PARAM_RANGE = {
    "zstd": (-131072, 22),
    "png": (0, 9),
    "jpegxl-lossless": (1, 9),
    "jpeg": (1, 100),
    "jpegxl": (1, 100),
}
# The image codecs (one frame per inner chunk, imagecodecs): each decodes only into the
# frame its array declares (Codec.decode_frame, decode_into).
IMAGE_CODECS = ("qoi", "png", "jpegxl-lossless", "jpeg", "jpegxl")
_LOSSY = frozenset({"jpeg", "jpegxl"})
# Channel counts an image-like key may have (QOI takes 3 or 4, PNG 1-4).
_CHANNELS = (1, 3, 4)
# Frames smaller than this on a side are not image-like (state vectors shaped as images).
_MIN_SIDE = 8
# The largest side libjpeg encodes.
_JPEG_MAX_SIDE = 65535


@dataclass(frozen=True)
class Codec:
    """One key's codec, parsed from a spec (:func:`parse_codec`).

    Parameters
    ----------
    name
        ``"raw"``, ``"zstd"``, ``"lossless"`` (resolved per key by :func:`choose_codec`),
        ``"qoi"``, ``"png"``, ``"jpegxl-lossless"``, ``"jpeg"``, ``"jpegxl"``, or ``"zarr"``
        (a zarr codec object given by the caller, written through zarr).
    param
        zstd level, PNG level, JPEG-XL effort (lossless) or quality (``jpeg``, ``jpegxl``).
    given
        The zarr codec object given by the caller (``ZstdCodec``, ``BloscCodec``...), if any.
    """

    name: str
    param: int | None = None
    given: Any = field(default=None, compare=False)

    @property
    def text(self) -> str:
        """The canonical spec (what the store records): ``"qoi"``, ``"jpeg:95"``."""
        if self.name == "zarr":
            return _object_text(self.given)
        if self.name == "zstd" and self.given is not None and self.given.checksum:
            return f"zstd:{self.param}+checksum"
        return self.name if self.param is None else f"{self.name}:{self.param}"

    @property
    def lossy(self) -> bool:
        """Whether decoded values may differ from those written."""
        return self.name in _LOSSY

    @property
    def is_image(self) -> bool:
        """Whether frames are encoded one at a time by an image codec (imagecodecs)."""
        return self.name in IMAGE_CODECS

    @property
    def checksum(self) -> bool:
        """Whether zstd frames carry their checksum (a ``ZstdCodec(checksum=True)``)."""
        return bool(self.name == "zstd" and self.given is not None and self.given.checksum)

    def numcodecs_config(self) -> dict[str, Any]:
        """The numcodecs configuration (``id`` included) of an image codec."""
        if self.name == "qoi":
            return {"id": "imagecodecs_qoi"}
        if self.name == "png":
            return {"id": "imagecodecs_png", "level": self.param}
        if self.name == "jpeg":
            return {"id": "imagecodecs_jpeg", "level": self.param, "subsampling": "444"}
        if self.name == "jpegxl-lossless":
            return {"id": "imagecodecs_jpegxl", "lossless": True, "effort": self.param}
        if self.name == "jpegxl":
            return {"id": "imagecodecs_jpegxl", "lossless": False, "level": self.param, "effort": 1}
        raise ValueError(f"codec {self.text!r} is not an image codec")

    def numcodec(self) -> Any:
        """The imagecodecs numcodecs object of an image codec (cached per spec)."""
        return _numcodec(self.text, tuple(sorted(self.numcodecs_config().items())))

    def encode_frame(self, frame: np.ndarray) -> bytes:
        """One ``[H, W, C]`` uint8 frame encoded (an image codec's stream); the codec's own
        error is :class:`InvalidCodecError` (the same frame never encodes)."""
        coder = self.numcodec()
        try:
            return bytes(coder.encode(np.ascontiguousarray(frame)))
        except (MemoryError, ImportError):
            raise
        except Exception as exc:
            raise InvalidCodecError(
                f"codec {self.text!r} cannot encode a {frame.dtype} frame of "
                f"{list(frame.shape)}: {exc}"
            ) from exc

    def decode_frame(self, data: bytes | memoryview, out: np.ndarray) -> np.ndarray:
        """One frame decoded into ``out`` (``[H, W, C]``, contiguous: the frame the array
        declares); a stream of another shape is refused before anything is allocated
        (``ValueError`` naming both shapes), whatever its header claims."""
        return decode_into(self.numcodec(), self.text, data, out)

    def zarr_codecs(self, layout: str) -> tuple[Any, ...]:
        """The Zarr v3 codec chain of one frame's inner chunk (``(1, 1, H, W, C)`` for
        ``layout`` ``"hwc"``, ``(1, 1, C, H, W)`` for ``"chw"``, transposed first)."""
        from zarr.codecs import TransposeCodec  # noqa: PLC0415

        from rbzarr.storage.zarr.zarr_codecs import image_codec  # noqa: PLC0415

        coder = image_codec(self.numcodecs_config())
        if layout == "chw":
            return (TransposeCodec(order=(0, 1, 3, 4, 2)), coder)
        return (coder,)


# Stored as it is (read in place).
RAW = Codec("raw")


def decode_into(numcodec: Any, name: str, data: bytes | memoryview, out: np.ndarray) -> np.ndarray:
    """One image stream decoded by an imagecodecs ``numcodec`` into ``out``, the frame an
    array declares: every image decode goes through here, so none allocates what a stream's
    header says.  imagecodecs' PNG, JPEG and JPEG-XL decoders check the header against
    ``out`` before they allocate; QOI's header is checked here (its decoder allocates first).
    A mismatch is a ``ValueError`` naming codec ``name``, the declared and the stream's shape.
    """
    try:
        if numcodec.codec_id == "imagecodecs_qoi":
            _check_qoi_header(data, out.shape)
        numcodec.decode(data, out=out)
    except ValueError as exc:  # imagecodecs: "invalid out.shape=..., shape=<the stream's>"
        raise ValueError(
            f"a {name} stream does not decode into the declared frame {list(out.shape)}: {exc}"
        ) from exc
    return out


def _check_qoi_header(data: bytes | memoryview, declared: tuple[int, ...]) -> None:
    """Refuse a QOI stream whose header (``qoif``, then big-endian width, height, and the
    channels) claims another frame than ``declared``; a stream without the magic is left to
    the decoder, which refuses it before allocating."""
    header = bytes(data[: _QOI_HEADER.size])
    if len(header) < _QOI_HEADER.size or not header.startswith(b"qoif"):
        return
    _, width, height, channels = _QOI_HEADER.unpack(header)
    if (height, width, channels) != tuple(declared):
        raise ValueError(f"the stream's header says shape={(height, width, channels)}")


_QOI_HEADER = struct.Struct(">4sIIB")


def require_images(what: str) -> None:
    """Raise :class:`CodecUnavailableError` naming the package when ``imagecodecs`` is
    missing."""
    try:
        import imagecodecs  # noqa: F401, PLC0415
    except ImportError as exc:
        raise _codec_unavailable(what, str(exc)) from exc


def _codec_unavailable(what: str, why: str) -> CodecUnavailableError:
    """The error of a codec this process cannot run (``why``: the import's failure)."""
    return CodecUnavailableError(
        f"{what} needs imagecodecs, which this Python cannot import ({why}): pip install "
        f"imagecodecs (a dependency of rbzarr; '{IMAGES_EXTRA}' installs it too)"
    )


def is_known(text: str) -> bool:
    """Whether spec ``text`` names a codec this rbzarr knows (its parameter aside)."""
    return text.strip().lower().partition(":")[0].removesuffix("+checksum") in _DEFAULT_PARAM


def unknown_codec(where: str, codec: str) -> CodecUnavailableError:
    """The error of data stored with a codec this process does not know (``codec``, as the
    store names it): a newer rbzarr or another package wrote it; it is not damaged."""
    return CodecUnavailableError(
        f"{where}: codec {codec!r} is not one this Python knows (a newer rbzarr, or a package "
        "not installed here, wrote it): upgrade rbzarr or install the codec's package to "
        "read it; the data is not damaged"
    )


def _numcodec(text: str, config: tuple[tuple[str, Any], ...]) -> Any:
    found = _NUMCODECS.get(text)
    if found is None:
        require_images(f"codec {text!r}")
        from rbzarr.storage.zarr.zarr_codecs import register_numcodecs  # noqa: PLC0415

        try:
            register_numcodecs()
        except ImportError as exc:
            raise _codec_unavailable(f"codec {text!r}", str(exc)) from exc
        from numcodecs import get_codec  # noqa: PLC0415

        found = _NUMCODECS[text] = get_codec(dict(config))
    return found


_NUMCODECS: dict[str, Any] = {}


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
        level = int(plain.param if plain.param is not None else 1)
        return Codec("zstd", level, given=ZstdCodec(level=level, checksum=True))
    name, sep, raw_param = text.partition(":")
    if name not in _DEFAULT_PARAM:
        known = ", ".join(repr(n) for n in _DEFAULT_PARAM)
        raise ValueError(f"codec {spec!r}: unknown name {name!r} (known: {known})")
    if not sep:
        if name in ("jpeg", "jpegxl"):
            raise ValueError(f"codec {spec!r}: give the quality, e.g. '{name}:95'")
        return Codec(name, _DEFAULT_PARAM[name])
    if name not in _PARAM_RANGE:
        raise ValueError(f"codec {spec!r}: {name!r} takes no parameter")
    try:
        param = int(raw_param)
    except ValueError:
        raise ValueError(f"codec {spec!r}: the parameter must be an integer") from None
    low, high = _PARAM_RANGE[name]
    if not low <= param <= high:
        raise ValueError(f"codec {spec!r}: {name} takes {low}..{high}, got {param}")
    return Codec(name, param)


def _from_object(spec: Any) -> Codec:
    """The :class:`Codec` of ``None`` (raw) or a zarr codec object."""
    if spec is None:
        return Codec("raw")
    if isinstance(spec, ZstdCodec):
        return Codec("zstd", int(spec.level), given=spec)
    if hasattr(spec, "to_dict"):
        return Codec("zarr", given=spec)
    raise ValueError(f"codec {spec!r}: expected a spec string, a zarr codec or None")


def parse_codecs(codecs: Mapping[str, Any] | None) -> dict[str, Codec]:
    """Every spec of a ``{key: spec}`` mapping parsed (``"default"`` included)."""
    if codecs is None:
        return {}
    if not isinstance(codecs, Mapping):
        raise ValueError(f"codecs must map keys to codec specs, got {type(codecs).__name__}")
    return {str(key): parse_codec(spec) for key, spec in codecs.items()}


def image_layout(shape: Sequence[int], dtype: Any) -> str | None:
    """``"hwc"`` or ``"chw"`` for image-like arrays (uint8 ``[T, B, H, W, C]`` or
    ``[T, B, C, H, W]``, ``C`` in 1, 3, 4, sides of at least 8), else ``None``."""
    if np.dtype(dtype) != np.uint8 or len(shape) != 5:
        return None
    *_, a, b, c = (int(d) for d in shape)
    if c in _CHANNELS and min(a, b) >= _MIN_SIDE:
        return "hwc"
    if a in _CHANNELS and min(b, c) >= _MIN_SIDE:
        return "chw"
    return None


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
            return Codec("raw")
        chosen = Codec("lossless")
    if chosen.name == "lossless":
        if layout is None:
            return Codec("raw") if key not in codecs else _not_image(key, chosen, shape, dtype)
        channels = int(shape[-1] if layout == "hwc" else shape[2])
        chosen = Codec("qoi") if channels in (3, 4) else Codec("png", 1)
    if chosen.is_image:
        if layout is None:
            if key not in codecs:  # a "default" image codec leaves other keys raw
                return Codec("raw")
            _not_image(key, chosen, shape, dtype)
        require_images(f"codec {chosen.text!r} of {key!r}")
        channels = int(shape[-1] if layout == "hwc" else shape[2])
        if chosen.name == "qoi" and channels not in (3, 4):
            raise InvalidCodecError(
                f"{key!r}: codec 'qoi' takes 3 or 4 channels, the frames have {channels} "
                "(use 'png' or 'lossless')"
            )
        sides = [int(d) for d in (shape[2:4] if layout == "hwc" else shape[3:5])]
        if chosen.name == "jpeg" and max(sides) > _JPEG_MAX_SIDE:
            raise InvalidCodecError(
                f"{key!r}: codec {chosen.text!r} takes frames of at most {_JPEG_MAX_SIDE} "
                f"pixels a side, the frames are {sides[0]}x{sides[1]} (use 'jpegxl' or 'png')"
            )
    return chosen


def _not_image(key: str, codec: Codec, shape: Sequence[int], dtype: Any) -> Codec:
    raise InvalidCodecError(
        f"{key!r}: codec {codec.text!r} takes image-like arrays (uint8 [T, B, H, W, C] or "
        f"[T, B, C, H, W], C in 1, 3, 4, sides of at least {_MIN_SIDE}), got "
        f"{np.dtype(dtype)} {list(shape)} (use 'raw' or 'zstd' for this key)"
    )


def _object_text(codec: Any) -> str:
    """A zarr codec object as text: ``blosc(cname=lz4, ...)``."""
    document = codec.to_dict()
    config = document.get("configuration") or {}
    args = ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
    return f"{document.get('name')}({args})"


def psnr(original: np.ndarray, decoded: np.ndarray) -> float:
    """Peak signal-to-noise ratio of uint8 ``decoded`` against ``original``, in dB over the
    whole arrays (``inf`` when identical)."""
    error = np.subtract(original, decoded, dtype=np.float64).reshape(-1)  # one temporary
    mse = float(error @ error) / error.size if error.size else 0.0
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
