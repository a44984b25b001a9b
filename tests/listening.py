"""Helpers of the listener's tests (tests/integration/test_listener_*.py): a Listener on
127.0.0.1 and the raw exchanges a test has with it."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
from collections.abc import Iterator

from collector.admission import Limits
from collector.http11 import Request, Response
from collector.listener import Listener
from tests.net import wait_until


@contextlib.contextmanager
def listening(
    handler, limits: Limits | None = None, sndbuf: int = 0, prepare=None
) -> Iterator[Listener]:
    """A Listener on 127.0.0.1; `sndbuf`: its connections' kernel send buffer, if not the
    default (accepted sockets inherit it); `prepare`, called with the listener before it
    serves."""
    sock = socket.socket()
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    listener = Listener(sock, handler, limits=limits)
    if prepare is not None:
        prepare(listener)
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            listener.serve_forever()
        except BaseException as error:
            raised.append(error)

    # daemons, with bounded waits: a shutdown that hangs fails the test, not the session
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    stopping = threading.Thread(target=listener.shutdown, daemon=True)
    try:
        yield listener
    finally:
        stopping.start()
        stopping.join(10)
        if not stopping.is_alive():
            listener.server_close()
        thread.join(10)
    assert not stopping.is_alive(), "shutdown did not return"
    assert not thread.is_alive(), "serve_forever did not return"
    assert not raised, f"serve_forever raised {raised[0]!r}"  # nor at its shutdown


def hello(request: Request) -> Response:
    return Response(200, f"{request.method} {request.path}\n".encode())


def exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data`, read until the server closes (or `timeout` passes: then "<open>")."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return until_closed(sock)


def until_closed(sock: socket.socket) -> bytes:
    """What the server sends before it closes (a reset ends it too), or before the
    socket's timeout passes: then followed by "<open>"."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return received + b"<open>"
    except ConnectionResetError:
        pass
    return received


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def pipelined_behind_one_in_flight(listener: Listener, client: socket.socket, path: str):
    """Send a request, and once it is in flight 500,000 requests for `path` behind it (as
    much as the kernel takes within the client's timeout); the server's connection."""
    client.sendall(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until(lambda: listener.admission.in_flight == 1, 10, "the first request in flight")
    with contextlib.suppress(TimeoutError):
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * 500_000)
    (connection,) = listener.connections
    return connection


def raise_own_open_files_limit(wanted: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= wanted, f"this test needs {wanted} open files (hard limit {hard})"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    return soft, hard


def open_sockets(pid: int) -> int:
    """The sockets a process holds (its other files, such as the cgroup directories a pass
    keeps open, come and go with the machine's pods)."""
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
    return count


def read_answer(sock: socket.socket, rest: bytearray) -> tuple[bytes, bytes]:
    """The next answer's head and body (by its Content-Length) off a kept-alive
    connection; `rest` holds what was read past it, for the next call."""
    while b"\r\n\r\n" not in rest:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {bytes(rest[:200])!r}"
        rest += chunk
    head, _, body = bytes(rest).partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    chunks = [body]
    got = len(body)
    while got < length:
        chunk = sock.recv(1 << 20)
        assert chunk, "closed before a whole body"
        chunks.append(chunk)
        got += len(chunk)
    body = b"".join(chunks)
    rest[:] = body[length:]
    return head, body[:length]
