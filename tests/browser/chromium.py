"""Debian's Chromium driven by Selenium, and the few verbs the scenarios speak.

Nothing here downloads anything: the browser and its driver are the system's (``apt-get install
chromium chromium-driver``), named by path, so Selenium Manager is never consulted. The profile is a
fresh temporary folder and every network feature of the browser that would phone home is off.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("STATEBOOK_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("STATEBOOK_CHROMEDRIVER", "/usr/bin/chromedriver"))
WIDTH, HEIGHT = 1280, 900
WAIT_SECONDS = 20.0
"""The longest a scenario waits for a page to show something (live updates on a loaded two-core machine)."""
PAGE_SECONDS = 30
"""The longest a page may take to load before the test fails (WebDriver's own default is 300 s)."""
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         f"--window-size={WIDTH},{HEIGHT}")


def missing() -> str | None:
    """What is missing to run a browser test, in words; None when everything is there."""
    absent = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        absent.append("the selenium package (pip install selenium; the test extra has it)")
    if not absent:
        return None
    return (f"browser tests need Chromium and its driver: missing {', '.join(absent)} "
            "(Debian/Ubuntu: apt-get install chromium chromium-driver)")


def required(environ: Mapping[str, str]) -> bool:
    """True when a missing browser must fail the browser tests rather than skip them: in CI."""
    return environ.get("STATEBOOK_REQUIRE_BROWSER") == "1" or environ.get("CI", "").lower() in ("true", "1")


def need_browser(problem: str | None, *, require: bool) -> None:
    """Skip the test for ``problem`` (what is missing), or fail it when the browser is ``require``-d."""
    if problem is None:
        return
    if require:
        pytest.fail(f"STATEBOOK_REQUIRE_BROWSER=1 (or CI=true) but {problem}", pytrace=False)
    pytest.skip(problem)


@contextmanager
def chromium() -> Iterator[Browser]:
    """One headless Chromium with a fresh profile, closed (and its profile removed) on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="statebook-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(PAGE_SECONDS)
    try:
        yield Browser(driver)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Browser:
    """The page a person sees, and what they do on it: open, read, type, press, wait."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.base = ""

    # -- moving around ---------------------------------------------------------------------------------
    def open(self, path_or_url: str) -> None:
        """Open a path of the served console (``/e/notification/ID``) or a whole URL (a link from an email)."""
        self.driver.get(path_or_url if "://" in path_or_url else self.base + path_or_url)

    def reset(self) -> None:
        """Leave the page (closing any server-sent event stream) and forget every cookie: cookies are kept per
        host, not per port, so one test's session would otherwise sign the next test's user in."""
        self.driver.get("about:blank")
        self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})

    @property
    def path(self) -> str:
        """The current page's path and query (without the server's address)."""
        url = self.driver.current_url
        return url[len(self.base):] if url.startswith(self.base) else url

    # -- reading ---------------------------------------------------------------------------------------
    def text(self, css: str = "body") -> str:
        """The visible text of the first element matching ``css``."""
        return self.find(css).text

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
        """Wait until ``condition()`` is truthy and return it; on timeout fail saying ``what`` was awaited and
        what the page showed instead."""
        from selenium.common.exceptions import StaleElementReferenceException, TimeoutException, WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1,
                                 ignored_exceptions=(StaleElementReferenceException,)).until(lambda _: condition())
        except TimeoutException:
            try:
                shown = self.text()[:1500]
            except WebDriverException:
                shown = "(no page)"
            raise AssertionError(f"waited {timeout:.0f} s for {what} on {self.path}; the page shows:\n{shown}") from None

    def wait_text(self, *needles: str, css: str = "body", timeout: float = WAIT_SECONDS) -> str:
        """Wait until the element ``css`` shows every one of ``needles`` (case-insensitive); its text."""
        def shown() -> str | None:
            found = self.all(css)
            text = found[0].text if found else ""
            return text if all(n.lower() in text.lower() for n in needles) else None
        return self.wait(shown, f"{' and '.join(map(repr, needles))} in {css}", timeout)

    # -- acting ----------------------------------------------------------------------------------------
    def fill(self, name: str, value: str, *, within: str = "body") -> None:
        """Type ``value`` into the field named ``name`` (clearing it first)."""
        field = self.find(f"{within} [name='{name}']")
        field.clear()
        field.send_keys(value)

    def press(self, label: str, *, within: str = "body") -> None:
        """Press the button (or submit input) whose visible label contains ``label`` (case-insensitive)."""
        buttons = [b for b in self.all(f"{within} button, {within} input[type=submit]")
                   if label.lower() in (b.text or b.get_attribute("value") or "").lower() and b.is_displayed()]
        assert buttons, f"no button labelled {label!r} on {self.path}; buttons: " + ", ".join(
            repr(b.text or b.get_attribute("value")) for b in self.all("button, input[type=submit]"))
        buttons[0].click()

    def follow(self, label: str, *, within: str = "body") -> None:
        """Click the first visible link (in ``within``) whose text contains ``label``."""
        links = [a for a in self.all(f"{within} a") if label.lower() in a.text.lower() and a.is_displayed()]
        assert links, f"no link {label!r} on {self.path}"
        links[0].click()

    def screenshot(self, path: Path, *, start: str | None = None, tallest: int = 1600) -> None:
        """Save the page as a PNG ``WIDTH`` pixels wide: from the top, or from the element ``start`` (a long
        page's part worth showing), down to the end of its content or at most ``tallest`` pixels."""
        import base64

        page = self.driver.execute_script(
            "const at = arguments[0] ? document.querySelector(arguments[0]) : null;"
            "return [at ? at.getBoundingClientRect().top + window.scrollY : 0,"
            "        document.body.getBoundingClientRect().bottom + window.scrollY + 24];",
            start)
        top, height = max(0, int(page[0]) - (16 if start else 0)), int(page[1])
        clip = {"x": 0, "y": top, "width": WIDTH, "height": max(1, min(height - top, tallest)), "scale": 1}
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                                     "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
