"""Headless chromium for the browser tests (selenium driving Debian's chromium).

:func:`browser_problem` names what is missing (the tests skip on a laptop without it, and
fail under FIBERFLOW_REQUIRE_SERVICES=1); :func:`headless_chromium` starts a driver and
always quits it.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any


def browser_problem() -> str | None:
    """Why no headless browser can run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[dev]')"
    for program in ("chromium", "chromedriver"):
        if shutil.which(program) is None:
            return f"{program} is not on PATH (apt-get install chromium chromium-driver)"
    return None


@contextlib.contextmanager
def headless_chromium(window_size: tuple[int, int] | None = None) -> Iterator[Any]:
    """A selenium driver of headless chromium (``window_size``: width and height in pixels)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(shutil.which("chromium"))
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    if window_size is not None:
        options.add_argument(f"--window-size={window_size[0]},{window_size[1]}")
    driver = webdriver.Chrome(
        options=options, service=Service(executable_path=str(shutil.which("chromedriver")))
    )
    try:
        yield driver
    finally:
        driver.quit()
