"""``rbzarr show`` and ``rbzarr report`` (issue 48): every picture format decoded back
against the stored frames, episodes cut as ``iter_episodes`` cuts them, clear errors, rows
read from S3 and not more, and a store that never changes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import av
import fsspec
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import make_trajectory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageSequence

import rbzarr.analysis.show as show_module
from benchmarks.accounting import StoreGeometry
from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.frames import episode_steps, find_episode, image_keys, trajectory_steps
from rbzarr.analysis.listing import StoreListing
from rbzarr.analysis.report_page import DEFAULT_EPISODES, write_report
from rbzarr.analysis.show import LABEL_HEIGHT, STRIP_HEIGHT, show_steps
from rbzarr.analysis.summary import describe_store
from rbzarr.analysis.view import open_buffer
from rbzarr.cli.main import main
from rbzarr.errors import EncoderUnavailableError, EpisodeNotFoundError, NotAnImageError
from rbzarr.trajectory.model import Trajectory

H, W = 16, 24
LOSSLESS, LOSSY = "curr_obs/image", "curr_obs/wrist"


def _trajectory(seed: int, T: int = 6, B: int = 3, side: tuple[int, int] = (H, W)) -> Trajectory:
    """Frames of 216 colours (a GIF holds them exactly), a lossy second camera, marks."""
    g = torch.Generator().manual_seed(seed)
    frames = (torch.randint(0, 6, (T, B, *side, 3), generator=g) * 40).to(torch.uint8)
    return Trajectory(
        max_episode_length=T,
        rewards=torch.randn(T, B, generator=g),
        dones=torch.rand(T, B, generator=g) < 0.3,
        truncations=torch.rand(T, B, generator=g) < 0.2,
        actions=torch.randn(T, B, 2, generator=g),
        curr_obs={
            "image": frames,
            "wrist": frames.flip(2).clone(),
            "state": torch.randn(T, B, 4, generator=g),
        },
        next_obs={"image": frames},
    )


def _store(path: Path, count: int = 3, **shape: Any) -> str:
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, layout_options={"codecs": {LOSSY: "jpeg:90"}}
    ) as buffer:
        buffer.add_trajectories([_trajectory(i, **shape) for i in range(count)])
    return str(path)


def _digest(root: str) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(root).rglob("*"))
        if p.is_file()
    }


def _decoded(path: Path) -> list[np.ndarray]:
    if path.suffix == ".mp4":
        with av.open(str(path)) as container:
            return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    with Image.open(path) as image:
        return [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]


def _stored(root: str, trajectory_id: int, env: int, key: str) -> np.ndarray:
    """The frames as the whole trajectory reads them (not the rows ``show`` reads)."""
    return open_buffer(root).trajectory(trajectory_id, [key]).tensors()[key][:, env].numpy()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _store(tmp_path_factory.mktemp("pictures") / "store")


@pytest.mark.parametrize("suffix", [".gif", ".webp"])
def test_animations_hold_every_step_with_the_stored_frames(
    store: str, tmp_path: Path, suffix: str
) -> None:
    before = _digest(store)
    out = tmp_path / f"t{suffix}"
    result = CliRunner().invoke(
        main, ["show", store, "1", "--env", "2", "--keys", LOSSLESS, "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    frames = _decoded(out)
    stored = _stored(store, 1, 2, LOSSLESS)
    assert len(frames) == len(stored) == 6
    assert all(frame.shape == (H + STRIP_HEIGHT, W, 3) for frame in frames)
    for frame, want in zip(frames, stored, strict=True):
        np.testing.assert_array_equal(frame[:H], want)
    assert _digest(store) == before and [p.name for p in tmp_path.iterdir()] == [out.name]


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    frames=st.lists(
        st.sampled_from([(9, 12, 3), (12, 8, 1), (10, 10, 4), (3, 11, 9), (1, 8, 14)]),
        min_size=1,
        max_size=3,
    ),
    T=st.integers(1, 4),
    env=st.integers(0, 1),
)
def test_every_frame_layout_shows_as_its_rgb_pixels(
    tmp_path_factory: pytest.TempPathFactory, frames: list[tuple[int, int, int]], T: int, env: int
) -> None:
    """HWC and CHW, grey, RGB and RGBA cameras of unequal sizes, side by side and exact."""
    g = torch.Generator().manual_seed(T)
    cameras = {
        f"cam{i}": torch.randint(0, 255, (T, 2, *shape), generator=g, dtype=torch.uint8)
        for i, shape in enumerate(frames)
    }
    root = tmp_path_factory.mktemp("layouts")
    trajectory = Trajectory(
        max_episode_length=T, rewards=torch.zeros(T, 2), dones=torch.zeros(T, 2, dtype=torch.bool)
    )
    trajectory.curr_obs = cameras
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=root / "s") as buffer:
        buffer.add_trajectories([trajectory])
    shown = trajectory_steps(open_buffer(root / "s"), 0, env, [f"curr_obs/{k}" for k in cameras])
    show_steps(shown, root / "t.webp")
    decoded = _decoded(root / "t.webp")
    assert len(decoded) == T
    x = 0
    for frame in cameras.values():
        hwc = frame[:, env].numpy()
        if hwc.shape[-1] not in (1, 3, 4):
            hwc = hwc.transpose(0, 2, 3, 1)
        rgb = np.repeat(hwc, 3, axis=-1) if hwc.shape[-1] == 1 else hwc[..., :3]
        height, width = rgb.shape[1:3]
        for row in range(T):
            np.testing.assert_array_equal(decoded[row][:height, x : x + width], rgb[row])
        x += width
    assert decoded[0].shape[1] == x


def test_side_by_side_cameras_and_their_psnr_label(store: str, tmp_path: Path) -> None:
    view = open_buffer(store)
    assert image_keys(view) == [LOSSLESS, LOSSY]
    shown = trajectory_steps(view, 0, 1, [LOSSLESS, LOSSY])
    assert set(shown.psnr) == {LOSSY} and 20 < shown.psnr[LOSSY] < 60
    result = show_steps(shown, tmp_path / "both.webp")
    frames = _decoded(tmp_path / "both.webp")
    assert result.frame_size == (2 * W, H + STRIP_HEIGHT) == frames[0].shape[1::-1]
    lossy = _stored(store, 0, 1, LOSSY)
    for row, frame in enumerate(frames):
        np.testing.assert_array_equal(frame[:H, :W], _stored(store, 0, 1, LOSSLESS)[row])
        np.testing.assert_array_equal(frame[:H, W:], lossy[row])  # as decoded, no re-encode


def test_the_contact_sheet_tiles_every_step(store: str, tmp_path: Path) -> None:
    shown = trajectory_steps(open_buffer(store), 2, 0, [LOSSLESS])
    result = show_steps(shown, tmp_path / "sheet.png")
    (sheet,) = _decoded(tmp_path / "sheet.png")
    assert (result.frames, result.columns, result.frame_size) == (6, 3, (W, H + LABEL_HEIGHT))
    assert sheet.shape == (2 * (H + LABEL_HEIGHT) + STRIP_HEIGHT, 3 * W, 3)
    for row, want in enumerate(_stored(store, 2, 0, LOSSLESS)):
        y, x = (row // 3) * (H + LABEL_HEIGHT), (row % 3) * W
        np.testing.assert_array_equal(sheet[y : y + H, x : x + W], want)


def test_mp4_has_a_frame_per_step_of_even_size(store: str, tmp_path: Path) -> None:
    result = show_steps(trajectory_steps(open_buffer(store), 1, 0, [LOSSLESS]), tmp_path / "t.mp4")
    frames = _decoded(tmp_path / "t.mp4")
    assert result.frame_size == (W, H + STRIP_HEIGHT)  # both even already
    assert len(frames) == 6 and all(f.shape == (H + STRIP_HEIGHT, W, 3) for f in frames)
    strip = frames[0][H + 20 : H + 40].astype(int)  # the plot band's grey behind the marks
    assert abs(np.median(strip) - 244) < 8


def test_episodes_are_cut_as_iter_episodes_cuts_them(store: str, tmp_path: Path) -> None:
    view = open_buffer(store)
    episodes = list(view.iter_episodes([LOSSLESS]))
    assert any(len(e.trajectory_ids) > 1 for e in episodes)  # some cross a trajectory
    for number in (0, len(episodes) // 2, len(episodes) - 1):
        found = find_episode(view, number)
        assert (found.trajectory_ids, found.env, found.start) == (
            episodes[number].trajectory_ids,
            episodes[number].env,
            episodes[number].start,
        )
        out = tmp_path / f"e{number}.webp"
        result = CliRunner().invoke(
            main, ["show", store, "--episode", str(number), "--keys", LOSSLESS, "-o", str(out)]
        )
        assert result.exit_code == 0, result.output
        frames = _decoded(out)
        want = episodes[number].fields[LOSSLESS].numpy()
        assert len(frames) == len(want)
        for frame, stored in zip(frames, want, strict=True):
            np.testing.assert_array_equal(frame[:H], stored)
    for missing in (len(episodes), -1):
        with pytest.raises(EpisodeNotFoundError, match=f"episodes 0..{len(episodes) - 1}$"):
            find_episode(view, missing)
    assert episode_steps(view, episodes[0], [LOSSLESS]).episode_starts == []


def test_the_strip_marks_episode_starts_where_dones_are(store: str) -> None:
    view = open_buffer(store)
    shown = trajectory_steps(view, 0, 0, [LOSSLESS])
    dones = view.trajectory(0, ["dones"]).tensors()["dones"][:, 0].numpy()
    assert shown.episode_starts == [int(t) + 1 for t in np.flatnonzero(dones) if t + 1 < 6]
    np.testing.assert_array_equal(shown.flags("dones"), dones)
    assert shown.flags("intervene_flags") is None


def test_bad_requests_fail_clearly_and_write_nothing(store: str, tmp_path: Path) -> None:
    before = _digest(store)
    out = tmp_path / "x.gif"
    cases = {
        ("show", store, "9", "-o", str(out)): "trajectory 9 is not in the index",
        ("show", store, "0", "--env", "3", "-o", str(out)): "envs 0..2, got --env 3",
        ("show", store, "--episode", "99", "-o", str(out)): "no episode 99",
        ("show", store, "0", "--keys", "rewards", "-o", str(out)): "'rewards' is not image-like",
        ("show", store, "0", "--keys", "curr_obs/nope", "-o", str(out)): "no key 'curr_obs/nope'",
        ("show", store, "0", "-o", str(tmp_path / "x.avi")): "unknown image suffix '.avi'",
        ("show", store, "-o", str(out)): "give a trajectory ID or --episode K",
        ("report", store, "--episodes", "0,99", "-o", str(tmp_path / "r.html")): "no episode 99",
    }
    for args, message in cases.items():
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code != 0 and message in result.output, (args, result.output)
    assert list(tmp_path.iterdir()) == []
    assert _digest(store) == before


def test_a_missing_video_encoder_is_named(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(show_module, "_VIDEO_CODEC", "no-such-encoder")
    shown = trajectory_steps(open_buffer(store), 0, 0, [LOSSLESS])
    with pytest.raises(EncoderUnavailableError, match="no-such-encoder"):
        show_steps(shown, tmp_path / "t.mp4")
    with pytest.raises(NotAnImageError):
        image_keys(open_buffer(store), ["rewards"])


def test_report_lists_every_episode_embeds_the_picked_and_changes_nothing(
    store: str, tmp_path: Path
) -> None:
    before = _digest(store)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", store, "--episodes", "1,3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    count = len(list(open_buffer(store).iter_episodes(["dones"])))
    assert f"{count} episodes listed, 2 shown" in result.output
    assert re.findall(r'<section class="episode" id="episode-(\d+)"', page) == ["1", "3"]
    assert page.count('src="data:video/mp4;base64,') == 2
    assert page.count("<tr><td>#") == count
    assert "curr_obs/wrist (PSNR " in page and "data:image/png;base64," in page
    assert "<td>curr_obs/image</td><td>uint8</td>" in page
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
    info = describe_store(StoreListing(store))
    first = write_report(open_buffer(store), info, tmp_path / "r.html")
    assert first.embedded == list(range(min(count, DEFAULT_EPISODES))) and count > 1
    assert _digest(store) == before


@pytest.mark.s3
def test_show_from_s3_reads_the_shown_rows_not_the_trajectory(
    tmp_path: Path,
    s3_bucket: str,
    s3_options: dict[str, Any],
    s3_proxy: Any,
    s3_direct_options: dict[str, Any],
) -> None:
    url = f"s3://{s3_bucket}/store"
    T, B = 4, 4
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3_direct_options
    ) as buffer:
        buffer.add_trajectories([_trajectory(i, T=T, B=B, side=(64, 64)) for i in range(2)])
    view = open_buffer(url, s3_options, layout_options={"zarr": {"range_gap": 0}})
    s3_proxy.reset_log()
    shown = trajectory_steps(view, 1, 3, [LOSSLESS])
    read = s3_proxy.bytes_to_client
    fs = fsspec.filesystem("s3", **s3_direct_options)
    geometry = StoreGeometry(fs, f"{s3_bucket}/store", [LOSSLESS], T, B)
    shown_rows = geometry.needed({1: [t * B + 3 for t in range(T)]}).bytes
    whole = geometry.needed({1: list(range(T * B))}).bytes
    assert read < 1.5 * shown_rows < whole / 2, (read, shown_rows, whole)
    local = trajectory_steps(
        open_buffer(_store(tmp_path / "s", 2, T=T, B=B, side=(64, 64))), 1, 3, [LOSSLESS]
    )
    np.testing.assert_array_equal(shown.frames[LOSSLESS], local.frames[LOSSLESS])
    show_steps(shown, tmp_path / "s3.png")
    assert (tmp_path / "s3.png").stat().st_size > 0


def test_a_store_without_cameras_gets_a_report_of_plots(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, i * 8) for i in range(2)])
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(store), "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "<video" not in page and page.count('<section class="episode"') >= 1
    assert '<line class="cursor"' in page
    shown = CliRunner().invoke(main, ["show", str(store), "0", "-o", str(tmp_path / "x.png")])
    assert shown.exit_code != 0 and "no image-like key" in shown.output
