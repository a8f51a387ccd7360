"""The image codecs: one frame per inner chunk, each frame an imagecodecs stream.

Each kind is one class (:class:`Qoi`, :class:`Png`, :class:`JpegXlLossless`, :class:`Jpeg`,
:class:`JpegXl`) that knows the frames it can encode, its numcodecs configuration and whether
it is lossy; :class:`Lossless` picks QOI or PNG per key.  Every decode goes through
:func:`decode_into`, bounded by the frame the array declares.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rbzarr.errors import CodecUnavailableError, InvalidCodecError
from rbzarr.storage.io import thread_pool
from rbzarr.storage.zarr.codec import Codec, Decoder, ParamCodec

__all__ = [
    "IMAGES_EXTRA",
    "ImageCodec",
    "Jpeg",
    "JpegXl",
    "JpegXlLossless",
    "Lossless",
    "Png",
    "Qoi",
    "decode_into",
    "frames",
    "image_layout",
    "require_images",
]

IMAGES_EXTRA = "rbzarr[images]"
# Channel counts an image-like key may have (QOI takes 3 or 4, PNG 1-4).
_CHANNELS = (1, 3, 4)
# Frames smaller than this on a side are not image-like (state vectors shaped as images).
_MIN_SIDE = 8


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


def frames(data: np.ndarray, layout: str) -> np.ndarray:
    """``[T * B, H, W, C]`` views of the frames of a ``[T, B, ...]`` uint8 array whose
    trailing dimensions lie as ``layout`` (``"hwc"`` or ``"chw"``)."""
    flat = data.reshape(-1, *data.shape[2:])
    return flat.transpose(0, 2, 3, 1) if layout == "chw" else flat


def _channels_and_sides(shape: Sequence[int], layout: str) -> tuple[int, list[int]]:
    """The channels and the ``[H, W]`` sides of an image-like array's frames."""
    if layout == "hwc":
        return int(shape[-1]), [int(d) for d in shape[2:4]]
    return int(shape[2]), [int(d) for d in shape[3:5]]


def _not_image(key: str, codec: Codec, shape: Sequence[int], dtype: Any) -> InvalidCodecError:
    return InvalidCodecError(
        f"{key!r}: codec {codec.text!r} takes image-like arrays (uint8 [T, B, H, W, C] or "
        f"[T, B, C, H, W], C in 1, 3, 4, sides of at least {_MIN_SIDE}), got "
        f"{np.dtype(dtype)} {list(shape)} (use 'raw' or 'zstd' for this key)"
    )


@dataclass(frozen=True)
class Lossless(Codec):
    """``"lossless"``: QOI for 3- or 4-channel frames, PNG level 1 for others; keys that are
    not image-like stay raw unless named."""

    name: ClassVar[str] = "lossless"
    kind: ClassVar[str] = ""  # never stored: resolved per key

    def resolved(self, channels: int) -> Codec:
        # docstring inherited
        return Qoi() if channels in (3, 4) else Png(1)

    def for_array(
        self, key: str, shape: Sequence[int], dtype: Any, layout: str | None, named: bool
    ) -> Codec | None:
        # docstring inherited
        if layout is None:
            if named:
                raise _not_image(key, self, shape, dtype)
            return None
        return self.resolved(_channels_and_sides(shape, layout)[0]).for_array(
            key, shape, dtype, layout, named
        )


@dataclass(frozen=True)
class ImageCodec(Codec):
    """A codec of one frame per inner chunk (imagecodecs, through numcodecs)."""

    kind: ClassVar[str] = "image"
    is_image: ClassVar[bool] = True

    def numcodecs_config(self) -> dict[str, Any]:
        """The numcodecs configuration (``id`` included)."""
        raise NotImplementedError

    def check_frames(self, key: str, channels: int, sides: list[int]) -> None:
        """Refuse frames of ``channels`` and ``[H, W]`` ``sides`` this codec cannot encode."""

    def for_array(
        self, key: str, shape: Sequence[int], dtype: Any, layout: str | None, named: bool
    ) -> Codec | None:
        # docstring inherited
        if layout is None:
            if not named:  # a "default" image codec leaves other keys raw
                return None
            raise _not_image(key, self, shape, dtype)
        require_images(f"codec {self.text!r} of {key!r}")
        self.check_frames(key, *_channels_and_sides(shape, layout))
        return self

    def layout(self, shape: Sequence[int], dtype: Any) -> str:
        # docstring inherited
        return image_layout(shape, dtype) or ""

    def inner(self, shape: Sequence[int], dtype: Any) -> tuple[int, ...]:
        # docstring inherited
        return (1, 1, *(int(d) for d in shape[2:]))

    def encode(self, data: np.ndarray, inner: tuple[int, ...], layout: str) -> list[Any]:
        """Every frame encoded, on the worker pool (imagecodecs releases the GIL)."""
        images = frames(data, layout)
        return thread_pool.run_all(self.encode_frame, list(images), len(images) > 1)

    def decoder(self, frame_shape: tuple[int, ...], layout: str) -> Decoder | None:
        # docstring inherited
        if layout == "chw":
            return functools.partial(_frame_chw_into, self, frame_shape)
        return functools.partial(_frame_into, self, frame_shape)

    def shard_codecs(self, dtype: np.dtype[Any], layout: str) -> tuple[Any, ...]:
        """The chain of one frame's inner chunk (``(1, 1, H, W, C)`` for ``layout``
        ``"hwc"``, ``(1, 1, C, H, W)`` for ``"chw"``, transposed first)."""
        from zarr.codecs import TransposeCodec  # noqa: PLC0415

        from rbzarr.storage.zarr.zarr_codecs import image_codec  # noqa: PLC0415

        coder = image_codec(self.numcodecs_config())
        if layout == "chw":
            return (TransposeCodec(order=(0, 1, 3, 4, 2)), coder)
        return (coder,)

    def described(self, layout: str) -> dict[str, Any]:
        # docstring inherited
        return {"codec": self.text, "image": layout}

    def numcodec(self) -> Any:
        """The imagecodecs numcodecs object (cached per spec)."""
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


@dataclass(frozen=True)
class Qoi(ImageCodec):
    """``"qoi"``: QOI frames of 3 or 4 channels (lossless)."""

    name: ClassVar[str] = "qoi"

    def numcodecs_config(self) -> dict[str, Any]:
        # docstring inherited
        return {"id": "imagecodecs_qoi"}

    def check_frames(self, key: str, channels: int, sides: list[int]) -> None:
        # docstring inherited
        if channels not in (3, 4):
            raise InvalidCodecError(
                f"{key!r}: codec 'qoi' takes 3 or 4 channels, the frames have {channels} "
                "(use 'png' or 'lossless')"
            )


@dataclass(frozen=True)
class Png(ParamCodec, ImageCodec):
    """``"png:<level>"``: PNG frames (lossless), zlib level 0-9."""

    name: ClassVar[str] = "png"
    params: ClassVar[tuple[int, int] | None] = (0, 9)

    def numcodecs_config(self) -> dict[str, Any]:
        # docstring inherited
        return {"id": "imagecodecs_png", "level": self.param}


@dataclass(frozen=True)
class JpegXlLossless(ParamCodec, ImageCodec):
    """``"jpegxl-lossless:<effort>"``: lossless JPEG-XL frames, effort 1-9."""

    name: ClassVar[str] = "jpegxl-lossless"
    params: ClassVar[tuple[int, int] | None] = (1, 9)

    def numcodecs_config(self) -> dict[str, Any]:
        # docstring inherited
        return {"id": "imagecodecs_jpegxl", "lossless": True, "effort": self.param}


# The largest side libjpeg encodes.
_JPEG_MAX_SIDE = 65535


@dataclass(frozen=True)
class Jpeg(ParamCodec, ImageCodec):
    """``"jpeg:<quality>"``: JPEG frames (lossy) with full 4:4:4 chroma."""

    name: ClassVar[str] = "jpeg"
    lossy: ClassVar[bool] = True
    params: ClassVar[tuple[int, int] | None] = (1, 100)
    needs_param: ClassVar[bool] = True

    def numcodecs_config(self) -> dict[str, Any]:
        # docstring inherited
        return {"id": "imagecodecs_jpeg", "level": self.param, "subsampling": "444"}

    def check_frames(self, key: str, channels: int, sides: list[int]) -> None:
        # docstring inherited
        if max(sides) > _JPEG_MAX_SIDE:
            raise InvalidCodecError(
                f"{key!r}: codec {self.text!r} takes frames of at most {_JPEG_MAX_SIDE} "
                f"pixels a side, the frames are {sides[0]}x{sides[1]} (use 'jpegxl' or 'png')"
            )


@dataclass(frozen=True)
class JpegXl(ParamCodec, ImageCodec):
    """``"jpegxl:<quality>"``: lossy JPEG-XL frames (effort 1)."""

    name: ClassVar[str] = "jpegxl"
    lossy: ClassVar[bool] = True
    params: ClassVar[tuple[int, int] | None] = (1, 100)
    needs_param: ClassVar[bool] = True

    def numcodecs_config(self) -> dict[str, Any]:
        # docstring inherited
        return {"id": "imagecodecs_jpegxl", "lossless": False, "level": self.param, "effort": 1}


def _frame_into(
    codec: ImageCodec, shape: tuple[int, ...], data: bytes | memoryview, target: np.ndarray
) -> None:
    """One ``[H, W, C]`` frame decoded straight into its row."""
    codec.decode_frame(data, out=target.reshape(shape))


def _frame_chw_into(
    codec: ImageCodec, shape: tuple[int, ...], data: bytes | memoryview, target: np.ndarray
) -> None:
    """One frame decoded into an ``[H, W, C]`` scratch of the declared size, then laid into
    its ``[C, H, W]`` row."""
    channels, height, width = shape
    decoded = codec.decode_frame(data, out=np.empty((height, width, channels), np.uint8))
    target.reshape(shape)[...] = decoded.transpose(2, 0, 1)


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
