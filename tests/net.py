"""Loopback helpers for the tests that start servers."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def wait_until(check, timeout: float, what: str):
    """Poll `check()` until it returns something true; fail after `timeout` seconds."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            last = check()
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout}s (last: {last!r})")
