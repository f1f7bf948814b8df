"""Headless Chromium for the dashboard tests: Debian's ``chromium`` and ``chromium-driver`` driven by selenium.

Nothing is downloaded at run time: the driver is given by path, so selenium-manager never runs. When the browser
is missing the tests fail with what to install (in CI, ``CI=true``) or are skipped with that same message on a
developer's machine; ``make test`` installs the packages first (as root).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("SPLITMQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SPLITMQ_CHROMEDRIVER", "/usr/bin/chromedriver")
WINDOW = (1280, 860)


def _missing(what: str) -> None:
    message = (f"{what}: the dashboard browser tests need Debian's chromium and chromium-driver "
               f"(run 'make test' as root, or 'apt-get install -y chromium chromium-driver'), and selenium "
               f"(pip install -e '.[dev]')")
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium session (a fresh profile in ``tmp_path``), quit at teardown."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed")
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (Path(path).exists() and os.access(path, os.X_OK)) and shutil.which(path) is None:
            _missing(f"{path} is missing")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
