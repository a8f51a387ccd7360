"""What every codec kind answers: the interface :mod:`rbzarr.storage.zarr.codecs` and
:mod:`rbzarr.storage.zarr.image_codecs` implement, one small class per kind (as zarr's codecs
are), so the writer, the readers and the tools ask the codec instead of branching on its name.

A codec's ``kind`` is the array kind a trajectory group's layout description records for it
(:mod:`rbzarr.storage.zarr.spec`): ``"mapped"`` (stored raw, one inner chunk: read in place),
``"chunked"`` (zstd inner chunks), ``"image"`` (one frame per inner chunk, an image codec's
stream) or ``"zarr"`` (any other codec: zarr's pipeline writes and reads the array).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rbzarr.errors import InvalidCodecError

__all__ = ["Codec", "Decoder", "ParamCodec"]

# Decodes one inner chunk's bytes into its uint8 target.
Decoder = Callable[[bytes | memoryview, np.ndarray], None]


@dataclass(frozen=True)
class Codec:
    """One key's codec: a subclass per kind knows its spec text, what it can encode, how it
    encodes and decodes, and its Zarr codecs.  Parsed from a spec by
    :func:`~rbzarr.storage.zarr.codecs.parse_codec`."""

    # The spec's name (``"qoi"``, ``"zstd"``).
    name: ClassVar[str]
    # The array kind a layout description records (see the module docs).
    kind: ClassVar[str]
    # Whether decoded values may differ from those written.
    lossy: ClassVar[bool] = False
    # Whether frames are encoded one at a time by an image codec (imagecodecs).
    is_image: ClassVar[bool] = False
    # Whether the stored bytes are the array's own (read in place, nothing to decode).
    in_place: ClassVar[bool] = False
    # The range of the spec's ``:<int>`` parameter (``None``: it takes none), and whether
    # the spec must give it (a lossy codec's quality).
    params: ClassVar[tuple[int, int] | None] = None
    needs_param: ClassVar[bool] = False

    @classmethod
    def with_param(cls, param: int) -> Codec:
        """The codec of spec ``<name>:<param>`` (``param`` in :attr:`params`)."""
        raise ValueError(f"{cls.name!r} takes no parameter")

    @property
    def text(self) -> str:
        """The canonical spec (what the store records): ``"qoi"``, ``"jpeg:95"``."""
        return self.name

    @property
    def checksum(self) -> bool:
        """Whether zstd frames carry their checksum."""
        return False

    def resolved(self, channels: int) -> Codec:
        """The concrete codec of frames of ``channels`` channels (``"lossless"`` picks one)."""
        return self

    def for_array(
        self, key: str, shape: Sequence[int], dtype: Any, layout: str | None, named: bool
    ) -> Codec | None:
        """The codec array ``key`` of ``shape`` and ``dtype`` is written with, checked
        (``None``: the key stays raw); ``layout`` is the array's image layout
        (:func:`~rbzarr.storage.zarr.image_codecs.image_layout`), ``named`` whether the
        caller named ``key`` (else the choice is ``"default"``'s).

        Raises
        ------
        InvalidCodecError
            The codec cannot encode the array.
        """
        return self

    def layout(self, shape: Sequence[int], dtype: Any) -> str:
        """How an image array's frames lie (``"hwc"``, ``"chw"``), ``""`` for other codecs."""
        return ""

    def inner(self, shape: Sequence[int], dtype: Any) -> tuple[int, ...]:
        """The inner chunk shape of a non-empty array stored in one shard."""
        raise InvalidCodecError(f"codec {self.text!r} is not stored in rbzarr's shards")

    def encode(self, data: np.ndarray, inner: tuple[int, ...], layout: str) -> list[Any]:
        """The shard's data parts of contiguous ``data`` (little endian), inner chunks of
        ``inner`` in C order of the grid."""
        raise InvalidCodecError(f"codec {self.text!r} is not stored in rbzarr's shards")

    def decoder(self, frame_shape: tuple[int, ...], layout: str) -> Decoder | None:
        """How an inner chunk becomes values (``None``: stored raw, read in place)."""
        raise InvalidCodecError(f"codec {self.text!r} is not stored in rbzarr's shards")

    def shard_codecs(self, dtype: np.dtype[Any], layout: str) -> tuple[Any, ...]:
        """The Zarr v3 codec chain inside the shard (what ``zarr.json`` records)."""
        raise InvalidCodecError(f"codec {self.text!r} is not stored in rbzarr's shards")

    def described(self, layout: str) -> dict[str, Any]:
        """What the layout description records of the codec, besides ``kind``."""
        return {"codec": self.text}

    def zarr_compressor(self) -> Any:
        """The compressor zarr writes an array of kind ``"zarr"`` (0-d, zero-size) with."""
        from zarr.codecs import ZstdCodec  # noqa: PLC0415

        return ZstdCodec(level=1)

    def encode_frame(self, frame: np.ndarray) -> bytes:
        """One ``[H, W, C]`` frame encoded on its own (``rbzarr codecs`` tries codecs so)."""
        raise ValueError(f"codec {self.text!r} cannot be tried frame by frame")

    def decode_frame(self, data: bytes | memoryview, out: np.ndarray) -> np.ndarray:
        """One frame of :meth:`encode_frame` decoded into ``out`` (the declared frame)."""
        raise ValueError(f"codec {self.text!r} cannot be tried frame by frame")


@dataclass(frozen=True)
class ParamCodec(Codec):
    """A codec whose spec takes one integer parameter, ``<name>:<param>`` (a level, an
    effort or a quality)."""

    param: int = 1

    @classmethod
    def with_param(cls, param: int) -> Codec:
        # docstring inherited
        return cls(param)

    @property
    def text(self) -> str:
        # docstring inherited
        return f"{self.name}:{self.param}"
