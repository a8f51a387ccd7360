"""Video frames in and out of mp4 files, with PyAV: sequential decoding and encoding.

Frames are ``uint8`` ``[H, W, 3]`` RGB.  Many episodes share one file: a reader hands out
the frames nearest to asked timestamps while it moves forward through the file, and a
writer appends episodes one after another, each starting where the previous one ended.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import IO, Any

import av
import numpy as np

from rbzarr.errors import DatasetMismatchError, UnsupportedDatasetError

__all__ = ["VideoFrameReader", "VideoFrameWriter", "check_decodable"]


def check_decodable(codec: str, where: str) -> None:
    """Raise :class:`UnsupportedDatasetError` unless PyAV can decode ``codec``."""
    try:
        av.codec.Codec(codec, "r")
    except ValueError as exc:  # PyAV's UnknownCodecError is a ValueError
        raise UnsupportedDatasetError(
            f"{where}: video codec {codec!r} cannot be decoded by this PyAV ({av.__version__})"
        ) from exc


class VideoFrameReader:
    """Decode one video file front to back, returning the frames nearest to given times."""

    def __init__(self, handle: IO[bytes], where: str) -> None:
        self.where = where
        container: Any = av.open(handle)
        stream = container.streams.video[0]
        check_decodable(stream.codec_context.name, where)
        self._container = container
        self._frames: Iterator[Any] = container.decode(stream)
        self._held: Any = None

    def frames_at(self, times: np.ndarray, tolerance: float) -> np.ndarray:
        """The frames within ``tolerance`` seconds of each of ``times`` (increasing)."""
        out: np.ndarray | None = None
        for row, wanted in enumerate(times):
            rgb = self._next_at(float(wanted), tolerance).to_ndarray(format="rgb24")
            if out is None:  # filled in place: one episode's frames, never two copies
                out = np.empty((len(times), *rgb.shape), dtype=np.uint8)
            out[row] = rgb
        if out is None:
            raise DatasetMismatchError(f"{self.where}: an episode asks for no frames")
        return out

    def _next_at(self, wanted: float, tolerance: float) -> Any:
        """Skip frames before ``wanted - tolerance``; the next must be within tolerance."""
        while True:
            frame = self._held if self._held is not None else next(self._frames, None)
            self._held = None
            if frame is None:
                raise DatasetMismatchError(
                    f"{self.where}: the video ends before the frame at {wanted:.4f} s"
                )
            time = float(frame.time)
            if time < wanted - tolerance:
                continue
            if time > wanted + tolerance:
                raise DatasetMismatchError(
                    f"{self.where}: no frame at {wanted:.4f} s (the nearest is at {time:.4f} s)"
                )
            return frame

    def close(self) -> None:
        """Close the container."""
        self._container.close()


class VideoFrameWriter:
    """Encode frames into one mp4 file at ``fps``, appending episode after episode."""

    def __init__(
        self,
        handle: IO[bytes],
        fps: int,
        height: int,
        width: int,
        codec: str,
        options: dict[str, str],
    ) -> None:
        container: Any = av.open(handle, mode="w", format="mp4")
        stream: Any = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        self._container, self._stream = container, stream
        self.fps, self.height, self.width = fps, height, width
        self.frames_written = 0

    @property
    def codec_name(self) -> str:
        """The codec's canonical name, as LeRobot records it (``"av1"``, ``"h264"``)."""
        return str(self._stream.codec.canonical_name)

    def append(self, frames: np.ndarray) -> tuple[float, float]:
        """Encode ``frames`` (``[n, H, W, 3]`` uint8); their ``(from, to)`` times in seconds."""
        start = self.frames_written
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = self.frames_written
            self._container.mux(self._stream.encode(frame))
            self.frames_written += 1
        return start / self.fps, self.frames_written / self.fps

    def close(self) -> None:
        """Flush the encoder and close the file."""
        self._container.mux(self._stream.encode(None))
        self._container.close()
