"""Loopback helpers for the tests that start servers."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import subprocess
import sys
import time
import urllib.request


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate `process`, and kill it if it has not ended within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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


def request(
    port: int,
    path: str = "/metrics",
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One GET on 127.0.0.1:`port` (HTTPS with `context`): status, headers, body."""
    if context is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def start_serve(
    port: int, *extra: str, interval: str = "1", prefix: tuple[str, ...] = ()
) -> subprocess.Popen:
    """`procdelta serve` on 127.0.0.1:`port`, its log on a pipe; `prefix` runs it under
    another command (e.g. setpriv)."""
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "collector", "serve", "--interval", interval,
         "--web.listen-address", f"127.0.0.1:{port}", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
