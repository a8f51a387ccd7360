"""Headless Chromium from Debian's packages (``chromium``, ``chromium-driver``), driven by
Selenium: what ``scripts/docs_pictures.py`` and the report page's browser test open."""

from __future__ import annotations

from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

__all__ = ["CHROMEDRIVER", "CHROMIUM", "chromium"]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Headless, offline and quiet: no GPU, sandbox, first-run page, background traffic or sync.
ARGUMENTS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium(profile: str, *arguments: str, **capabilities: Any) -> webdriver.Chrome:
    """A headless Chromium with its profile in folder ``profile``, given ``arguments``
    besides :data:`ARGUMENTS` and the ``capabilities`` named (``goog:loggingPrefs``...)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (*ARGUMENTS, f"--user-data-dir={profile}", *arguments):
        options.add_argument(argument)
    for name, value in capabilities.items():
        options.set_capability(name, value)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
