"""A store as one self-contained HTML page (``rbzarr report``): no server, no other file.

The page holds what ``info`` prints, as tables; the ``plot`` figure; every episode with
its length and return; and a bounded number of episodes in full: their camera keys side by
side as an embedded H.264 video, and plots of reward, actions and low-dimensional
observations whose cursor follows the video's time.  Camera keys of a lossy codec are
labelled with the PSNR it recorded.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from rbzarr.analysis.episodes import Episode
from rbzarr.analysis.frames import MARKS, ShownSteps, episode_steps, image_keys
from rbzarr.analysis.show import camera_rows, even, open_video_writer
from rbzarr.errors import EpisodeNotFoundError
from rbzarr.trajectory.steps import DONES, REWARDS

if TYPE_CHECKING:
    from rbzarr.analysis.store_arrays import StoreArrays
    from rbzarr.analysis.view import BufferView

__all__ = ["DEFAULT_EPISODES", "ReportResult", "write_report"]

# Episodes shown in full when none are picked.
DEFAULT_EPISODES = 20
_PLOT_WIDTH, _PLOT_HEIGHT, _PAD = 640, 110, 6
_VIDEO_CRF = 23
# Longer episode lists start folded.
_OPEN_LIST = 200


@dataclass(frozen=True)
class ReportResult:
    """What :func:`write_report` wrote: the page, its bytes, episodes listed and embedded."""

    path: str
    bytes: int
    episodes: int
    embedded: list[int]


def write_report(
    view: BufferView | StoreArrays,
    info: Mapping[str, Any],
    path: str | os.PathLike[str],
    episodes: Sequence[int] | None = None,
    keys: Sequence[str] | None = None,
    fps: int = 10,
    progress: bool = False,
    across_trajectories: bool = True,
) -> ReportResult:
    """Write the report page of ``view`` to ``path``.

    Parameters
    ----------
    view
        The store, opened read-only.
    info
        Its summary, as :func:`rbzarr.analysis.summary.describe_store` returns it.
    path
        The HTML file to write.
    episodes
        Episode numbers (in :meth:`BufferView.iter_episodes` order) to embed in full;
        ``None``: the first :data:`DEFAULT_EPISODES`.
    keys
        Camera keys of the videos; ``None``: every image-like ``curr_obs`` key (a store
        without any gets plots only).
    fps
        Steps per second of the videos.
    progress
        A tqdm bar on stderr once it runs longer than a second.
    across_trajectories
        Follow episodes into the next trajectory of their run; ``False`` cuts them at
        trajectory boundaries.

    Returns
    -------
    ReportResult
        The page written.

    Raises
    ------
    EpisodeNotFoundError
        An episode of ``episodes`` the store does not have.
    NotAnImageError
        A key of ``keys`` that is not image-like, or a store without one.
    EncoderUnavailableError
        PyAV or its H.264 encoder is not installed.
    """
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    cameras = image_keys(view, keys, required=False)
    listed = _episodes(view, across_trajectories, progress)
    wanted = list(range(min(DEFAULT_EPISODES, len(listed)))) if episodes is None else episodes
    for number in wanted:
        if not 0 <= number < len(listed):
            raise EpisodeNotFoundError(
                f"{view.url}: no episode {number}; the store has {len(listed)} episodes"
            )
    plotted = _plotted_keys(view, cameras)
    sections = []
    bar = tqdm(wanted, desc="report", unit="episode", disable=not progress, delay=1.0)
    for number in bar:
        shown = episode_steps(view, listed[number], cameras, plotted)
        sections.append(_episode_section(number, shown, fps))
    page = _page(view, info, _figure(view, across_trajectories), listed, wanted, sections)
    data = page.encode()
    with open(path, "wb") as handle:
        handle.write(data)
    return ReportResult(os.fspath(path), len(data), len(listed), list(wanted))


def _episodes(
    view: BufferView | StoreArrays, across_trajectories: bool, progress: bool
) -> list[Episode]:
    """Every episode, as :meth:`BufferView.iter_episodes` yields them (read into numpy)."""
    from rbzarr.analysis.cluster import TrajectoryTasks  # noqa: PLC0415

    available = view.keys()
    keys = [key for key in (REWARDS, DONES) if key in available]
    tasks = TrajectoryTasks()
    return list(
        tasks.episodes(view, keys, progress=progress, across_trajectories=across_trajectories)
    )


def _plotted_keys(view: BufferView | StoreArrays, cameras: Sequence[str]) -> list[str]:
    """Per-step keys the plots draw: actions and low-dimensional observations."""
    schema = view.schema()
    return [
        key
        for key, (_, shape) in schema.items()
        if key not in cameras
        and (key == "actions" or key.startswith("curr_obs/"))
        and int(np.prod(shape, dtype=np.int64)) <= 64
    ]


def _figure(view: BufferView | StoreArrays, across_trajectories: bool) -> str:
    """The ``plot`` figure as a data URL; ``""`` for a store without rewards."""
    available = view.keys()
    if REWARDS not in available:
        return ""
    from rbzarr.analysis.plotting import plot_store  # noqa: PLC0415 (matplotlib)

    out = io.BytesIO()
    plot_store(view, out, across_trajectories=across_trajectories, image_format="png")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _video_element(shown: ShownSteps, fps: int) -> str:
    """The episode's ``<video>`` (nothing for a store without camera keys)."""
    if not shown.frames:
        return ""
    source = _video(shown, fps)
    return f'<video controls muted playsinline preload="auto" src="{source}"></video>'


def _video(shown: ShownSteps, fps: int) -> str:
    """The episode's camera frames side by side as an H.264 MP4 data URL."""
    out = io.BytesIO()
    rows = (even(row) for row in camera_rows(shown))
    first = next(rows)
    writer = open_video_writer(out, fps, first.shape[0], first.shape[1], crf=_VIDEO_CRF)
    writer.append(first[None])
    for row in rows:
        writer.append(row[None])
    writer.close()
    return "data:video/mp4;base64," + base64.b64encode(out.getvalue()).decode()


def _episode_section(number: int, shown: ShownSteps, fps: int) -> str:
    labels = " | ".join(
        html.escape(key if key not in shown.psnr else f"{key} (PSNR {shown.psnr[key]:.1f} dB)")
        for key in shown.frames
    )
    plots = "".join(
        _svg_plot(key, values, len(shown))
        for key, values in shown.values.items()
        if key not in MARKS
    )
    marks = _marks_text(shown)
    return (
        f'<section class="episode" id="episode-{number}" data-fps="{fps}" '
        f'data-steps="{len(shown)}">\n<h3>episode {number}: {html.escape(shown.title)}</h3>\n'
        f'<p class="cameras">{labels}</p>\n'
        f"{_video_element(shown, fps)}\n"
        f'<p>step <span class="step">1</span> of {len(shown)}{marks}</p>\n'
        f'<div class="plots">{plots}</div>\n</section>\n'
    )


def _marks_text(shown: ShownSteps) -> str:
    parts = []
    for name in MARKS:
        flags = shown.flags(name)
        if flags is not None and flags.any():
            parts.append(f"{name} at steps {', '.join(str(i + 1) for i in np.flatnonzero(flags))}")
    return "" if not parts else " &middot; " + html.escape("; ".join(parts))


def _x(step: float, count: int) -> float:
    return _PAD + (step + 0.5) * (_PLOT_WIDTH - 2 * _PAD) / max(1, count)


def _svg_plot(key: str, values: np.ndarray, count: int) -> str:
    """One SVG: each of ``key``'s dimensions (at most 8) over the steps, and the cursor."""
    columns = values[:, :8]
    finite = columns[np.isfinite(columns)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = high - low or 1.0
    lines = []
    for d in range(columns.shape[1]):
        points = " ".join(
            f"{_x(i, count):.1f},"
            f"{_PLOT_HEIGHT - _PAD - (v - low) / span * (_PLOT_HEIGHT - 2 * _PAD):.1f}"
            for i, v in enumerate(columns[:, d])
            if np.isfinite(v)
        )
        lines.append(f'<polyline class="d{d % 8}" points="{points}"/>')
    more = f", first 8 of {values.shape[1]}" if values.shape[1] > 8 else ""
    x0 = _x(0, count)
    return (
        f"<figure><figcaption>{html.escape(key)} ({low:.3g} .. {high:.3g}{more})</figcaption>"
        f'<svg viewBox="0 0 {_PLOT_WIDTH} {_PLOT_HEIGHT}" width="{_PLOT_WIDTH}" '
        f'height="{_PLOT_HEIGHT}">{"".join(lines)}'
        f'<line class="cursor" data-step="0" x1="{x0:.1f}" x2="{x0:.1f}" y1="0" '
        f'y2="{_PLOT_HEIGHT}"/></svg></figure>'
    )


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    head = f"<thead><tr>{cells}</tr></thead>" if header else ""
    body = "\n".join(
        "<tr>" + "".join(f"<td>{_cell(value)}</td>" for value in row) + "</tr>" for row in rows
    )
    return f"<table>{head}<tbody>\n{body}\n</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape("-" if value is None else str(value))


def _summary(info: Mapping[str, Any]) -> str:
    ratio = info.get("compression_ratio")
    store = info.get("store") or {}
    general = [
        ("url", info["url"]),
        ("format", info["format"]),
        ("layout version", info.get("layout_version")),
        ("trajectories", info["trajectories"]),
        ("samples", info["total_samples"]),
        ("next id", info.get("trajectory_counter")),
        ("seed", info.get("seed")),
        ("raw bytes", info["raw_bytes"]),
        ("bytes on disk", info["bytes_on_disk"]),
        ("compression (raw / on disk)", ratio),
        ("files", store.get("files")),
        ("file bytes", store.get("file_bytes")),
        ("JSON documents", store.get("json_files")),
    ]
    keys = [
        (
            key,
            item["dtype"],
            item["shape"],
            item["chunks"],
            item.get("codec_spec") or item["codec"],
            item["raw_bytes"],
            item["bytes_on_disk"],
            item.get("psnr"),
        )
        for key, item in info["keys"].items()
    ]
    header = ["key", "dtype", "shape", "chunks", "codec", "raw bytes", "on disk", "PSNR dB"]
    return _table([], general) + "\n<h3>keys</h3>\n" + _table(header, keys)


def _episode_rows(listed: Sequence[Episode], embedded: set[int]) -> Iterator[Sequence[Any]]:
    for number, episode in enumerate(listed):
        ids = episode.trajectory_ids or (episode.trajectory_id,)
        link = f"#{number}" if number not in embedded else f"#{number} (shown)"
        span = str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}"
        ret = episode.episode_return
        yield link, episode.env, span, episode.start, episode.length, ret, episode.done


def _page(
    view: BufferView | StoreArrays,
    info: Mapping[str, Any],
    figure: str,
    listed: Sequence[Episode],
    embedded: Sequence[int],
    sections: Sequence[str],
) -> str:
    title = html.escape(f"rbzarr report: {view.url}")
    figure_html = (
        f'<img class="figure" alt="rewards, returns and episode lengths" src="{figure}">'
        if figure
        else "<p>The store has no rewards to plot.</p>"
    )
    header = ["episode", "env", "trajectories", "start", "length", "return", "done"]
    episodes_table = _table(header, _episode_rows(listed, set(embedded)))
    shown_note = (
        f"{len(embedded)} of {len(listed)} episodes are shown below "
        "(<code>rbzarr report --episodes</code> picks them)."
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<link rel="icon" href="data:,"><title>{title}</title>\n<style>{_STYLE}</style>'
        f"</head><body>\n<h1>{title}</h1>\n<h2>store</h2>\n{_summary(info)}\n"
        f"<h2>rewards and episodes</h2>\n{figure_html}\n"
        f"<h2>episodes</h2>\n<p>{shown_note}</p>\n"
        f"<details{' open' if len(listed) <= _OPEN_LIST else ''}>"
        f"<summary>all {len(listed)} episodes</summary>{episodes_table}</details>\n"
        f"{''.join(sections)}"
        f"<script>{_SCRIPT}</script>\n"
        "</body></html>\n"
    )


_STYLE = """
body { font-family: sans-serif; margin: 1em 2em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
img.figure { max-width: 100%; }
section.episode { border-top: 2px solid #888; margin-top: 1.5em; }
video { display: block; max-width: 100%; image-rendering: pixelated; min-width: 320px; }
figure { margin: 0.3em 0; }
figcaption { font-size: 0.85em; color: #333; }
svg { background: #f6f6f6; }
polyline { fill: none; stroke-width: 1.5; }
.d0 { stroke: #1f77b4; } .d1 { stroke: #ff7f0e; } .d2 { stroke: #2ca02c; }
.d3 { stroke: #d62728; } .d4 { stroke: #9467bd; } .d5 { stroke: #8c564b; }
.d6 { stroke: #e377c2; } .d7 { stroke: #7f7f7f; }
line.cursor { stroke: #000; stroke-width: 1.5; }
"""

# Each episode's cursor follows its video: the step shown is floor(currentTime * fps).
_SCRIPT = f"""
"use strict";
const WIDTH = {_PLOT_WIDTH}, PAD = {_PAD};
for (const section of document.querySelectorAll("section.episode")) {{
  const video = section.querySelector("video");
  if (video === null) continue;  // no camera keys: plots only
  const fps = Number(section.dataset.fps), steps = Number(section.dataset.steps);
  const cursors = section.querySelectorAll("line.cursor");
  const label = section.querySelector(".step");
  const follow = () => {{
    const step = Math.max(0, Math.min(steps - 1, Math.floor(video.currentTime * fps + 1e-6)));
    const x = (PAD + (step + 0.5) * (WIDTH - 2 * PAD) / Math.max(1, steps)).toFixed(1);
    for (const cursor of cursors) {{
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
      cursor.dataset.step = String(step);
    }}
    label.textContent = String(step + 1);
  }};
  const playing = () => {{
    follow();
    if (!video.paused && !video.ended) requestAnimationFrame(playing);
  }};
  video.addEventListener("timeupdate", follow);
  video.addEventListener("seeked", follow);
  video.addEventListener("play", playing);
}}
"""
