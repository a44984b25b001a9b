"""HTTP over 127.0.0.1, as the bench talks to the servers it starts: a free port, a page."""

from __future__ import annotations

import http.client
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(port: int, path: str = "/metrics") -> bytes:
    """The body of one GET of `path`, on a connection of its own."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        return connection.getresponse().read()
    finally:
        connection.close()
