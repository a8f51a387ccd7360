"""``rbzarr report``'s page in a real browser (headless Chromium from Debian's packages,
driven by Selenium; ``scripts/dev.sh test`` installs them): it loads with no console error,
every shown episode's video plays, and seeking a video moves its plots' cursor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.chromium import chromium
from rbzarr import TrajectoryReplayBuffer
from rbzarr.cli.main import main
from rbzarr.trajectory.model import Trajectory

FPS = 10


def _trajectory(seed: int, T: int = 12, B: int = 2) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    return Trajectory(
        max_episode_length=T,
        rewards=torch.randn(T, B, generator=g),
        dones=torch.rand(T, B, generator=g) < 0.15,
        actions=torch.randn(T, B, 3, generator=g),
        curr_obs={
            "image": torch.randint(0, 255, (T, B, 32, 32, 3), generator=g, dtype=torch.uint8),
            "state": torch.randn(T, B, 4, generator=g),
        },
    )


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    driver = chromium(
        str(profile),
        "--autoplay-policy=no-user-gesture-required",
        **{"goog:loggingPrefs": {"browser": "ALL"}},
    )
    driver.set_script_timeout(20)
    yield driver
    driver.quit()


def test_the_page_plays_every_shown_episode_and_its_cursor_follows(
    tmp_path: Path, browser: webdriver.Chrome
) -> None:
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        buffer.add_trajectories([_trajectory(i) for i in range(3)])
    page = tmp_path / "out" / "report.html"
    page.parent.mkdir()
    result = CliRunner().invoke(
        main, ["report", str(store), "--episodes", "0,2,4", "--fps", str(FPS), "-o", str(page)]
    )
    assert result.exit_code == 0, result.output

    browser.get(page.as_uri())
    sections = browser.find_elements("css selector", "section.episode")
    assert [s.get_attribute("id") for s in sections] == ["episode-0", "episode-2", "episode-4"]
    for section in sections:
        video = section.find_element("css selector", "video")
        steps = int(section.get_attribute("data-steps"))
        browser.execute_async_script(
            "const [v, done] = arguments; v.play().then(() => done(), e => done(String(e)));",
            video,
        )
        WebDriverWait(browser, 10).until(
            lambda _, v=video: browser.execute_script("return arguments[0].currentTime", v) > 0
        )
        browser.execute_script("arguments[0].pause()", video)
        cursors = section.find_elements("css selector", "line.cursor")
        assert len(cursors) >= 2  # rewards, actions, curr_obs/state
        for step in (steps - 1, 0, steps // 2):
            browser.execute_async_script(
                "const [v, t, done] = arguments;"
                "v.addEventListener('seeked', () => done(), {once: true}); v.currentTime = t;",
                video,
                (step + 0.5) / FPS,
            )
            assert {c.get_attribute("data-step") for c in cursors} == {str(step)}
            xs = {c.get_attribute("x1") for c in cursors}
            assert len(xs) == 1
            x = float(xs.pop())
            assert x == pytest.approx(6 + (step + 0.5) * (640 - 12) / steps, abs=0.06)
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
