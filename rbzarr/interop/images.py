"""LeRobot's image features: PNG frames in a parquet column, with Pillow.

A column holds one ``struct<bytes: binary, path: string>`` per frame (the Hugging Face
``Image`` feature), the PNG file's bytes embedded.  PNG is lossless, so frames decode to
the very ``uint8`` ``[H, W, 3]`` arrays that were encoded.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
from PIL import Image

from rbzarr.errors import DatasetMismatchError

__all__ = ["IMAGE_TYPE", "decode_images", "png_column"]

IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def png_column(frames: np.ndarray) -> pa.Array:
    """``[T, H, W, 3]`` uint8 frames as a column of embedded PNG images (named as LeRobot
    names its frame files)."""
    encoded = []
    for frame in frames:
        out = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(frame)).save(out, format="PNG")
        encoded.append(out.getvalue())
    return pa.StructArray.from_arrays(
        [
            pa.array(encoded, pa.binary()),
            pa.array([f"frame-{row:06d}.png" for row in range(len(encoded))], pa.string()),
        ],
        fields=list(IMAGE_TYPE),
    )


def decode_images(column: pa.ChunkedArray, shape: list[int], where: str) -> np.ndarray:
    """A column of embedded images as ``[T, *shape]`` uint8 frames (RGB)."""
    values = column.combine_chunks()
    if not pa.types.is_struct(values.type) or values.type.get_field_index("bytes") < 0:
        raise DatasetMismatchError(f"{where}: an image column holds {values.type}, not images")
    blobs = values.field("bytes").to_pylist()
    out = np.empty((len(blobs), *shape), dtype=np.uint8)
    for row, blob in enumerate(blobs):
        if blob is None:
            raise DatasetMismatchError(f"{where}: frame {row} has no embedded image bytes")
        with Image.open(io.BytesIO(blob)) as image:
            frame = np.asarray(image.convert("RGB"))
        if list(frame.shape) != list(shape):
            raise DatasetMismatchError(
                f"{where}: frame {row} is {list(frame.shape)}, info.json says {list(shape)}"
            )
        out[row] = frame
    return out
