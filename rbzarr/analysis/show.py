"""Pictures of shown steps: an MP4, animated GIF or WebP, or a PNG contact sheet (``show``).

Each picture puts the camera keys side by side, frames untouched at the top, and a strip
under them: the key names (with the PSNR a lossy codec recorded), the reward over the
shown steps, marks where ``dones``, ``terminations``, ``truncations`` and
``intervene_flags`` are set, a line where an episode starts, and the current step.  Needs
Pillow (``datasets`` extra); MP4 needs PyAV's H.264 encoder.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from rbzarr.analysis.frames import ShownSteps
from rbzarr.analysis.plotting import image_format_of
from rbzarr.errors import EncoderUnavailableError
from rbzarr.trajectory.steps import DONES, REWARDS

__all__ = [
    "FORMATS",
    "STRIP_HEIGHT",
    "ShowResult",
    "camera_rows",
    "open_video_writer",
    "output_format",
    "show_steps",
]

# File suffixes and the pictures they name.
FORMATS = {".mp4": "mp4", ".gif": "gif", ".webp": "webp", ".png": "png"}
STRIP_HEIGHT = 72
# A contact sheet's band under each tile: the step, its reward and marks.
LABEL_HEIGHT = 14
_VIDEO_CODEC = "libx264"
_BACKGROUND = (255, 255, 255)
_PLOT = (16, 52)  # the strip's plot band, rows from..to
# (field, colour, rows of the plot band) of each mark.
_MARK_STYLE = (
    (DONES, (220, 30, 30), (16, 22)),
    ("terminations", (240, 140, 0), (22, 28)),
    ("truncations", (130, 50, 200), (28, 34)),
    ("intervene_flags", (20, 160, 60), (46, 52)),
)
_LEGEND = ((REWARDS, (30, 90, 200)), *((name, colour) for name, colour, _ in _MARK_STYLE))


@dataclass(frozen=True)
class ShowResult:
    """What :func:`show_steps` wrote: ``frames`` pictures of ``frame_size`` (width,
    height); a contact sheet lays them out as tiles in ``columns`` columns."""

    path: str
    format: str
    frames: int
    frame_size: tuple[int, int]
    columns: int = 1


def output_format(path: str | os.PathLike[str]) -> str:
    """The picture format ``path``'s suffix names (``"mp4"``, ``"gif"``, ``"webp"``, ``"png"``).

    Raises
    ------
    ValueError
        Another suffix.
    """
    return image_format_of(path, FORMATS)


def camera_rows(shown: ShownSteps) -> Iterator[np.ndarray]:
    """Each shown step's camera frames side by side, ``[H, W, 3]`` (a shorter frame padded
    below with white)."""
    frames = list(shown.frames.values())
    height = max(f.shape[1] for f in frames)
    width = sum(f.shape[2] for f in frames)
    for row in range(len(shown)):
        canvas = np.full((height, width, 3), 255, dtype=np.uint8)
        x = 0
        for f in frames:
            canvas[: f.shape[1], x : x + f.shape[2]] = f[row]
            x += f.shape[2]
        yield canvas


def show_steps(
    shown: ShownSteps, path: str | os.PathLike[str], fps: int = 10, progress: bool = False
) -> ShowResult:
    """Write ``shown`` to ``path`` in the format its suffix names (:data:`FORMATS`).

    Parameters
    ----------
    shown
        The steps, from :func:`~rbzarr.analysis.frames.trajectory_steps` or
        :func:`~rbzarr.analysis.frames.episode_steps`.
    path
        The output file: ``.mp4``, ``.gif``, ``.webp`` (one frame per step, the strip's
        cursor on it) or ``.png`` (a contact sheet: one tile per step, the strip under them).
    fps
        Steps per second of an animation.
    progress
        A tqdm bar on stderr once it runs longer than a second.

    Returns
    -------
    ShowResult
        What was written.

    Raises
    ------
    ValueError
        An unknown suffix, or ``fps`` not positive.
    EncoderUnavailableError
        Pillow, or for MP4 PyAV's H.264 encoder, is not installed.
    """
    image_format = output_format(path)
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    image = _pillow()
    bar = tqdm(total=len(shown), desc="show", unit="frame", disable=not progress, delay=1.0)
    with bar:
        if image_format == "png":
            return _contact_sheet(shown, os.fspath(path), image, bar)
        strip = Strip(shown, sum(f.shape[2] for f in shown.frames.values()))
        pictures = (
            np.concatenate([row, strip.at(i)])
            for i, row in enumerate(camera_rows(shown))
            if bar.update(1) or True
        )
        if image_format == "mp4":
            size = _write_mp4(pictures, os.fspath(path), fps)
        else:
            size = _write_animation(pictures, os.fspath(path), image_format, fps, image)
    return ShowResult(os.fspath(path), image_format, len(shown), size)


def _pillow() -> Any:
    try:
        from PIL import Image  # noqa: PLC0415 (datasets extra)
    except ImportError as exc:
        raise EncoderUnavailableError(
            "writing pictures needs Pillow: pip install 'rbzarr[datasets]'"
        ) from exc
    return Image


def open_video_writer(handle: Any, fps: int, height: int, width: int, crf: int) -> Any:
    """An H.264 :class:`~rbzarr.interop.video.VideoFrameWriter` (``height`` and ``width``
    even) on ``handle``.

    Raises
    ------
    EncoderUnavailableError
        PyAV, or its H.264 encoder, is not installed.
    """
    try:
        import av  # noqa: PLC0415 (datasets extra)

        from rbzarr.interop.video import VideoFrameWriter  # noqa: PLC0415
    except ImportError as exc:
        raise EncoderUnavailableError(
            "writing MP4 needs PyAV: pip install 'rbzarr[datasets]'"
        ) from exc
    try:
        av.codec.Codec(_VIDEO_CODEC, "w")
    except ValueError as exc:  # PyAV's UnknownCodecError is a ValueError
        raise EncoderUnavailableError(
            f"writing MP4 needs the {_VIDEO_CODEC} encoder, which this PyAV ({av.__version__}) "
            "lacks; write a .gif, .webp or .png instead"
        ) from exc
    options = {"crf": str(crf), "preset": "veryfast"}  # 2-3x medium's speed, no larger
    return VideoFrameWriter(handle, fps, height, width, _VIDEO_CODEC, options)


def even(picture: np.ndarray) -> np.ndarray:
    """``picture`` padded with white to an even height and width (as H.264's 4:2:0 needs)."""
    height, width = picture.shape[0], picture.shape[1]
    if height % 2 == 0 and width % 2 == 0:
        return picture
    return np.pad(picture, ((0, height % 2), (0, width % 2), (0, 0)), constant_values=255)


def _write_mp4(pictures: Iterator[np.ndarray], path: str, fps: int) -> tuple[int, int]:
    first = even(next(pictures))
    height, width = first.shape[:2]
    with open(path, "wb") as handle:
        writer = open_video_writer(handle, fps, height, width, crf=12)
        writer.append(first[None])
        for picture in pictures:
            writer.append(even(picture)[None])
        writer.close()
    return width, height


def _write_animation(
    pictures: Iterator[np.ndarray], path: str, image_format: str, fps: int, image: Any
) -> tuple[int, int]:
    if image_format == "gif":
        frames = [_paletted(picture, image) for picture in pictures]
        options: dict[str, Any] = {"optimize": False, "disposal": 1}
    else:
        frames = [image.fromarray(picture) for picture in pictures]
        options = {"lossless": True, "method": 0, "quality": 0}  # fastest; still exact
    frames[0].save(
        path,
        format=image_format.upper(),
        save_all=True,
        append_images=frames[1:],
        duration=round(1000 / fps),
        loop=0,
        **options,
    )
    return frames[0].size


def _paletted(picture: np.ndarray, image: Any) -> Any:
    """A GIF frame: exact when the picture has at most 256 colours, else quantized."""
    wide = picture.astype(np.uint32)
    packed = (wide[..., 0] << 16) | (wide[..., 1] << 8) | wide[..., 2]
    colours, indices = np.unique(packed.reshape(-1), return_inverse=True)
    if colours.size > 256:
        return image.fromarray(picture).quantize(256, method=image.Quantize.FASTOCTREE)
    frame = image.fromarray(indices.reshape(picture.shape[:2]).astype(np.uint8), mode="P")
    rgb = np.stack([(colours >> 16) & 255, (colours >> 8) & 255, colours & 255], axis=1)
    frame.putpalette(rgb.astype(np.uint8).reshape(-1).tolist())
    return frame


def _contact_sheet(shown: ShownSteps, path: str, image: Any, bar: tqdm[Any]) -> ShowResult:
    rows = camera_rows(shown)
    columns = math.ceil(math.sqrt(len(shown)))
    tiles = math.ceil(len(shown) / columns)
    first = next(rows)
    tile_height, tile_width = first.shape[0] + LABEL_HEIGHT, first.shape[1]
    width = columns * tile_width
    sheet = np.full((tiles * tile_height + STRIP_HEIGHT, width, 3), 255, dtype=np.uint8)
    rewards = shown.values.get(REWARDS)
    for i, row in enumerate((first, *rows)):
        y, x = (i // columns) * tile_height, (i % columns) * tile_width
        sheet[y : y + row.shape[0], x : x + tile_width] = row
        trajectory_id, t = shown.steps[i]
        label = f"{trajectory_id}:{t}"
        if rewards is not None:
            label += f" r={rewards[i].sum():.3g}"
        label += "".join(f" {name}" for name, _, _ in _MARK_STYLE if _is_set(shown, name, i))
        _text(sheet, (x + 2, y + row.shape[0]), label, (0, 0, 0), image)
        bar.update(1)
    sheet[-STRIP_HEIGHT:] = Strip(shown, width).at(None)
    image.fromarray(sheet).save(path, format="PNG", compress_level=1)  # photos: speed wins
    return ShowResult(path, "png", len(shown), (tile_width, tile_height), columns)


def _is_set(shown: ShownSteps, name: str, row: int) -> bool:
    flags = shown.flags(name)
    return flags is not None and bool(flags[row])


@functools.cache
def _font() -> Any:
    from PIL import ImageFont  # noqa: PLC0415

    return ImageFont.load_default(size=11)


def _text(canvas: np.ndarray, at: tuple[int, int], text: str, colour: Any, image: Any) -> None:
    """Draw ``text`` (not anti-aliased: few colours) into ``canvas`` at ``at``, within the
    one line of rows below ``at`` (only those rows are copied)."""
    from PIL import ImageDraw  # noqa: PLC0415

    x, y = at
    rows = canvas[y : y + LABEL_HEIGHT]
    picture = image.fromarray(rows)
    draw = ImageDraw.Draw(picture)
    draw.fontmode = "1"
    draw.text((x, 0), text, fill=colour, font=_font())
    rows[...] = np.asarray(picture)


class Strip:
    """The band under the frames: key names, reward, marks, episode starts and a cursor."""

    def __init__(self, shown: ShownSteps, width: int) -> None:
        from PIL import Image  # noqa: PLC0415

        self.shown, self.width = shown, width
        self.count = max(1, len(shown))
        band = np.full((STRIP_HEIGHT, width, 3), 255, dtype=np.uint8)
        band[_PLOT[0] : _PLOT[1]] = 244
        x = 0
        for key, frames in shown.frames.items():
            measured = shown.psnr.get(key)
            label = key if measured is None else f"{key} (PSNR {measured:.1f} dB)"
            _text(band, (x + 2, 1), label, (0, 0, 0), Image)
            x += frames.shape[2]
        for start in shown.episode_starts:
            band[_PLOT[0] : _PLOT[1], max(0, self.x_edge(start) - 1) : self.x_edge(start) + 1] = 90
        for name, colour, (top, bottom) in _MARK_STYLE:
            flags = shown.flags(name)
            for row in [] if flags is None else np.flatnonzero(flags):
                x = self.x_of(int(row))
                band[top:bottom, max(0, x - 1) : x + 2] = colour
        self._reward_line(band)
        self.legend_x = self._legend(band, Image)
        self.background = band
        self.image = Image

    def x_edge(self, row: int) -> int:
        """The x where step ``row`` begins."""
        return min(self.width - 1, row * self.width // self.count)

    def x_of(self, row: int) -> int:
        """The x of step ``row``'s middle."""
        return min(self.width - 1, (2 * row + 1) * self.width // (2 * self.count))

    def _reward_line(self, band: np.ndarray) -> None:
        rewards = self.shown.values.get(REWARDS)
        if rewards is None or not len(rewards):
            return
        from PIL import Image, ImageDraw  # noqa: PLC0415

        total = rewards.sum(axis=1)
        low, high = float(total.min()), float(total.max())
        span = high - low or 1.0
        top, bottom = _PLOT[0] + 3, _PLOT[1] - 3
        points = [
            (self.x_of(i), round(bottom - (value - low) / span * (bottom - top)))
            for i, value in enumerate(total)
        ]
        picture = Image.fromarray(band)
        draw = ImageDraw.Draw(picture)
        if len(points) > 1:
            draw.line(points, fill=_LEGEND[0][1], width=2)
        for x, y in points:
            draw.rectangle((x - 1, y - 1, x + 1, y + 1), fill=_LEGEND[0][1])
        band[...] = np.asarray(picture)

    def _legend(self, band: np.ndarray, image: Any) -> int:
        """The legend at the strip's bottom right; the x where it begins."""
        names = [(n, c) for n, c in _LEGEND if n == REWARDS or self.shown.flags(n) is not None]
        x = self.width - 2
        for name, colour in reversed(names):
            x -= int(_font().getlength(name)) + 8
            _text(band, (x, _PLOT[1] + 3), name, colour, image)
        return x

    def at(self, row: int | None) -> np.ndarray:
        """The strip with the cursor and the step's caption at ``row`` (``None``: the title)."""
        band = self.background.copy()
        if row is None:
            _text(band, (2, _PLOT[1] + 3), self.shown.title, (0, 0, 0), self.image)
            return band
        x = self.x_of(row)
        band[_PLOT[0] : _PLOT[1], max(0, x - 1) : x + 1] = 0
        trajectory_id, t = self.shown.steps[row]
        caption = f"step {row + 1}/{len(self.shown)} | trajectory {trajectory_id}, t={t}"
        rewards = self.shown.values.get(REWARDS)
        if rewards is not None:
            caption += f" | reward {rewards[row].sum():.3g}"
        _text(band, (2, _PLOT[1] + 3), caption, (0, 0, 0), self.image)
        return band
