"""Make docs/cli.md's pictures of ``rbzarr show`` and ``rbzarr report`` from a real store.

    python scripts/docs_pictures.py [--out docs] [--size 128] [--trajectories 8]

The store holds photographs (scikit-image's, a camera moving over them: the ``photos``
frames of ``benchmarks/frames.py``), two cameras (the wrist one JPEG-coded, so its PSNR is
labelled) and RLinf's fields.  ``show`` draws trajectory 3's env 1 (an episode ends in it)
as a contact sheet (``cli-show.png``); ``report``'s page is opened in headless Chromium
(:mod:`benchmarks.chromium`), its first episode's video moved to 1 s, and the window saved
(``cli-report.png``).  Needs the test extra and Debian's ``chromium`` / ``chromium-driver``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is not installed

from benchmarks.frames import PHOTOS, FrameSource, rollout, to_trajectory  # noqa: E402
from rbzarr import TrajectoryReplayBuffer  # noqa: E402
from rbzarr.cli.main import main as rbzarr  # noqa: E402

T, B = 8, 2
WINDOW = (1100, 1000)


def make_store(path: Path, size: int, count: int) -> None:
    """``count`` trajectories of photos at ``size`` pixels, written to a new store."""
    source = FrameSource(f"photos{size}", size, "photos", ",".join(PHOTOS))
    codecs = {"curr_obs/wrist_images": "jpeg:90", "next_obs/wrist_images": "jpeg:90"}
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, layout_options={"codecs": codecs}
    ) as buffer:
        for arrays in rollout(source.scenes(B, seed=0), count, T, B, seed=0):
            buffer.add_trajectories([to_trajectory(arrays, T)])


def screenshot(page: Path, out: Path) -> None:
    """The report page in headless Chromium, its first episode at 1 s, saved to ``out``."""
    from benchmarks.chromium import chromium  # noqa: PLC0415 (the test extra: selenium)

    with tempfile.TemporaryDirectory() as profile:
        driver = chromium(profile, "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}")
        try:
            driver.set_script_timeout(20)
            driver.get(page.as_uri())
            driver.execute_async_script(
                "const done = arguments[0];"
                "const section = document.querySelector('section.episode');"
                "const video = section.querySelector('video');"
                "section.scrollIntoView();"
                "video.addEventListener('seeked', () => done(), {once: true});"
                "video.currentTime = 1.05;"
            )
            driver.save_screenshot(str(out))
        finally:
            driver.quit()


def make_pictures(out: Path, size: int, count: int, work: Path) -> list[Path]:
    """Write ``cli-show.png`` and ``cli-report.png`` to ``out``; the store lives in ``work``."""
    store = work / "photos"
    make_store(store, size, count)
    out.mkdir(parents=True, exist_ok=True)
    shown, page = out / "cli-show.png", work / "report.html"
    rbzarr(["show", str(store), "3", "--env", "1", "-o", str(shown)], standalone_mode=False)
    rbzarr(["report", str(store), "--episodes", "0,1", "-o", str(page)], standalone_mode=False)
    screenshot(page, out / "cli-report.png")
    return [shown, out / "cli-report.png"]


def main() -> None:
    """Parse the command line and make the pictures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--size", type=int, default=128, help="frame side in pixels")
    parser.add_argument("--trajectories", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for path in make_pictures(args.out, args.size, args.trajectories, Path(work)):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
