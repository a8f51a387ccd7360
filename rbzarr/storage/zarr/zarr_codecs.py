"""imagecodecs' numcodecs codecs as Zarr v3 codecs, registered with zarr.

zarr 3.1 decodes a numcodecs codec named ``numcodecs.<id>`` in an array's ``zarr.json``
only when a class is registered under that name; it ships classes for numcodecs' own codecs,
not for imagecodecs'.  The classes here (``array -> bytes``: one frame in, one image stream
out) are registered when this module is imported (``import rbzarr`` does), and by the
``zarr.codecs`` entry points of rbzarr's package, so plain ``zarr.open_group`` decodes an
rbzarr store with imagecodecs installed.  Importing this module does not import imagecodecs.

A chunk decodes into a buffer of the shape the array declares (``out=``), never into what
the stream's header claims: a hostile frame's mismatch is a :class:`CorruptStoreError` (a
``ValueError``) naming the declared and the stream's shape, raised before it is allocated.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
from zarr.codecs.numcodecs import _NumcodecsArrayBytesCodec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer, NDBuffer
from zarr.registry import register_codec

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.zarr.image_codecs import decode_into

__all__ = ["Jpeg", "Jpegxl", "Png", "Qoi", "image_codec", "register_numcodecs"]


class _ImageCodec(_NumcodecsArrayBytesCodec):
    """An imagecodecs numcodecs codec; its numcodecs class is registered on first use.

    zarr's numcodecs classes warn at every construction (every document parsed) that
    numcodecs codecs are outside the v3 specification; these do not: rbzarr documents it.
    """

    def __init__(self, **codec_config: Any) -> None:
        codec_id = self.codec_name.removeprefix("numcodecs.")
        if codec_config.setdefault("id", codec_id) != codec_id:
            raise ValueError(f"codec id {codec_config['id']!r} is not {codec_id!r}")
        object.__setattr__(self, "codec_config", codec_config)

    @property
    def _codec(self) -> Any:
        register_numcodecs()
        from numcodecs import get_codec  # noqa: PLC0415

        return get_codec(dict(self.codec_config))

    async def _decode_single(self, chunk_data: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        """One chunk decoded into a buffer of the shape the array declares (never the shape
        the stream's header claims: a hostile frame is refused before it is allocated)."""
        out = np.empty(chunk_spec.shape, dtype=chunk_spec.dtype.to_native_dtype())
        frame = out.reshape(_frame_shape(chunk_spec.shape))
        try:
            await asyncio.to_thread(
                decode_into, self._codec, self.codec_name, chunk_data.to_bytes(), frame
            )
        except ValueError as exc:
            raise CorruptStoreError(str(exc)) from exc
        return chunk_spec.prototype.nd_buffer.from_numpy_array(out)


class Qoi(_ImageCodec, codec_name="imagecodecs_qoi"):
    """QOI (lossless) frames."""


class Png(_ImageCodec, codec_name="imagecodecs_png"):
    """PNG (lossless) frames."""


class Jpeg(_ImageCodec, codec_name="imagecodecs_jpeg"):
    """JPEG frames (lossy)."""


class Jpegxl(_ImageCodec, codec_name="imagecodecs_jpegxl"):
    """JPEG-XL frames (lossless or lossy)."""


_CLASSES: dict[str, type[_ImageCodec]] = {
    "numcodecs.imagecodecs_qoi": Qoi,
    "numcodecs.imagecodecs_png": Png,
    "numcodecs.imagecodecs_jpeg": Jpeg,
    "numcodecs.imagecodecs_jpegxl": Jpegxl,
}
for _name, _cls in _CLASSES.items():
    register_codec(_name, _cls)


@functools.cache
def register_numcodecs() -> None:
    """Register imagecodecs' codecs with numcodecs (once); ``ImportError`` without it."""
    from imagecodecs.numcodecs import register_codecs  # noqa: PLC0415

    ids = [name.removeprefix("numcodecs.") for name in _CLASSES]
    register_codecs(ids, verbose=False)


def _frame_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A chunk's shape without its leading unit dimensions (``(1, 1, H, W, C)``: one frame,
    ``[H, W, C]``), as imagecodecs lays a frame out."""
    leading = 0
    while leading < len(shape) - 2 and shape[leading] == 1:
        leading += 1
    return shape[leading:]


def image_codec(config: dict[str, Any]) -> _ImageCodec:
    """The Zarr v3 codec of numcodecs ``config`` (its ``id`` one of the classes here)."""
    cls = _CLASSES[f"numcodecs.{config['id']}"]
    return cls(**{k: v for k, v in config.items() if v is not None})
