"""docs/cli.md's pictures of ``show`` and ``report`` come from scripts/docs_pictures.py:
the page names them, and the script (run small here) makes both from a real photo store."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PICTURES = ("cli-show.png", "cli-report.png")


def _script() -> object:
    spec = importlib.util.spec_from_file_location(
        "docs_pictures", ROOT / "scripts/docs_pictures.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_shows_a_picture_of_each_command() -> None:
    text = (ROOT / "docs/cli.md").read_text()
    for name in PICTURES:
        assert f"]({name})" in text
        with Image.open(ROOT / "docs" / name) as picture:
            assert picture.width >= 600


def test_the_script_makes_both_pictures_from_photos(tmp_path: Path) -> None:
    script = _script()
    written = script.make_pictures(tmp_path / "out", 32, 4, tmp_path)  # type: ignore[attr-defined]
    assert [p.name for p in written] == list(PICTURES)
    with Image.open(written[0]) as sheet:
        frames = np.asarray(sheet.convert("RGB"))
    T = script.T  # type: ignore[attr-defined]
    columns = int(np.ceil(np.sqrt(T)))
    assert frames.shape[1] == columns * 2 * 32  # two cameras side by side per tile
    assert frames[:32, :32].std() > 5  # a photo, not a blank tile
    with Image.open(written[1]) as screenshot:
        assert screenshot.width == script.WINDOW[0]  # type: ignore[attr-defined]
        page = np.asarray(screenshot.convert("RGB"))
    assert (page.std(axis=(0, 1)) > 10).all()  # a page with pictures, not a blank window
