"""Debian's Chromium for the browser tests: how it is started, and what a page's errors are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from playwright.async_api import BrowserContext, ConsoleMessage
from playwright.async_api import Error as PlaywrightError

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The event loop the browser tests run in (tests/e2e/conftest.py): the session's, since one
# Chromium serves a process's browser tests and Playwright's objects belong to one loop.
BROWSER_LOOP = "session"

# Short enough that a broken page fails fast, long enough for a loaded CI machine.
TIMEOUT_MS = 10_000

# Records every CSP violation the page reports, including ones Chromium does not log.
CSP_PROBE = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


ContextFactory = Callable[[], Awaitable[BrowserContext]]


@dataclass
class PageErrors:
    """What went wrong inside the page: console errors and uncaught exceptions."""

    console: list[str] = field(default_factory=list)
    uncaught: list[str] = field(default_factory=list)

    def on_console(self, message: ConsoleMessage) -> None:
        """Keep console messages of type error."""
        if message.type == "error":
            self.console.append(f"{message.text} ({message.location.get('url', '')})")

    def on_pageerror(self, error: PlaywrightError) -> None:
        """Keep uncaught exceptions."""
        self.uncaught.append(str(error))
