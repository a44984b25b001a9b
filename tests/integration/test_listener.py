"""The listener holds whatever clients do: a deadline for a request's head, a bound on the
requests answered at once and on the connections held, a flood that leaves nothing
behind, and nothing a client sends answered with a traceback. Loopback only; every socket
and server a test makes is closed when it ends, failed or not."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import resource
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from collector.http11 import MAX_HEAD_BYTES, Heads, Request, Response
from collector.listener import MAX_ASIDE, Deferred, Limits, Listener, RefusalLog, Seldom
from tests.needs import tool
from tests.net import free_port, request, start_serve, wait_until


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


def test_pipelined_requests_head_and_connection_close():
    with listening(hello) as listener:
        port = listener.server_address[1]
        answer = exchange(
            port,
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nHEAD /b?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert b"GET /a\n" in answer and b"HEAD /b\n" not in answer and b"GET /c\n" in answer
    assert answer.endswith(b"Connection: close\r\n\r\nGET /c\n")


def test_connection_close_is_a_token_of_the_list_not_a_substring():
    """`Connection: close` among other tokens closes; a token that merely contains the
    word (`x-closer`) keeps the connection open for the next request."""
    with listening(hello) as listener:
        port = listener.server_address[1]
        answer = exchange(
            port,
            b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: x-closer\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n"
            b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
        )
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert b"GET /a\n" in answer and b"GET /b\n" in answer and b"GET /c\n" not in answer


def test_a_head_sent_a_byte_at_a_time_is_read_whole():
    """The end of a head is found across the pieces it arrives in (each scanned once)."""
    with listening(hello) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for byte in b"GET /bytes HTTP/1.1\r\nHost: x\r\n\r\n":
                sock.sendall(bytes([byte]))
                time.sleep(0.002)
            answer = b""
            while not answer.endswith(b"GET /bytes\n"):
                answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET /  HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"GET / HTTP/2.0\r\n\r\n", b"505"),
        (b"GET ftp:x HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n", b"400"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic a\r\n"
            b"Authorization: Basic b\r\n\r\n",
            b"400",
        ),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", b"413"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"413"),
        (b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70_000,
            b"431",
        ),  # no end yet: not buffered on
        (b"GET / HTTP/1.0\r\n\r\n", b"200"),
        # a bare LF or CR a proxy in front may read as a line's end (RFC 9112 section 2.2):
        # a Content-Length only it sees would make the body a request of its own here
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\nContent-Length: 5\r\n\r\nhello", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\rContent-Length: 5\r\n\r\nhello", b"400"),
        (b"GET /a\nforged-log-line HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", b"400"),  # RFC 9110 section 5.5
        (b"\r\n\r\nGET / HTTP/1.0\r\n\r\n", b"200"),  # empty lines before a request
        # RFC 9112 section 3.2: an HTTP/1.1 request names its Host, once
        (b"GET / HTTP/1.1\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", b"400"),
        # a header's name is a token: no space before the colon (RFC 9112 section 5.1,
        # a smuggling vector), no control characters, no separators
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\nhello", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX\x01Y: a\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n(X): a\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Ok_1.2~!: a\r\nConnection: close\r\n\r\n", b"200"),
    ],
)
def test_what_a_request_may_not_be_is_answered_and_closed(data, status):
    with listening(hello) as listener:
        answer = exchange(listener.server_address[1], data)
    assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:80]
    assert not answer.endswith(b"<open>")  # closed after the answer


def test_a_pipeline_longer_than_a_head_is_answered_whole():
    """Requests pipelined past one head's 64 KiB pause the reading while one is answered,
    and it resumes: every one is answered, none left hanging."""
    one = b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n"
    count = 2 * MAX_HEAD_BYTES // len(one) + 1
    data = one * count + b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with listening(hello) as listener:
        answer = exchange(listener.server_address[1], data, timeout=20)
    assert not answer.endswith(b"<open>")
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == count + 1 and answer.endswith(b"GET /last\n")


def test_a_head_with_bare_lf_line_ends_is_refused_at_once():
    """Lines ended by LF alone never make the CR LF CR LF a head ends with: refused as soon
    as one comes, not left to the head's deadline (10 s by default)."""
    with listening(hello) as listener:
        started = time.monotonic()
        answer = exchange(listener.server_address[1], b"GET / HTTP/1.1\nHost: x\n\n")
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 400 ") and b"without CR" in answer, answer[:120]
    assert took < 2


def test_every_answer_says_nosniff():
    """No browser reads an answer as another type than it says (an error naming what the
    client sent, read as HTML): every status, every path."""
    with listening(hello) as listener:
        port = listener.server_address[1]
        for data in (
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n",
        ):
            head = exchange(port, data).split(b"\r\n\r\n", 1)[0]
            assert b"\r\nX-Content-Type-Options: nosniff" in head, head


def test_a_request_head_has_one_deadline_however_slowly_it_comes():
    """A client trickling a header byte every 0.1 s is cut off at the head's deadline (the
    old per-read timeout never fired), and one that sends nothing at all too."""
    with listening(hello, Limits(header_timeout=1.0)) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port)) as silent:
            with socket.create_connection(("127.0.0.1", port)) as slow:
                slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
                began = time.monotonic()
                cut = False
                while time.monotonic() - began < 10:
                    try:
                        slow.sendall(b"X")
                    except OSError:
                        cut = True
                        break
                    if closed_by_server(slow, 0.1):
                        cut = True
                        break
                assert cut, "a trickling client held its connection 10 s"
                assert time.monotonic() - began < 8
            assert closed_by_server(silent, 5)
        # a kept-alive connection's next request has the same deadline from its first byte
        with socket.create_connection(("127.0.0.1", port)) as kept:
            kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            kept.settimeout(5)
            answer = b""
            while not answer.endswith(b"GET /\n"):
                answer += kept.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            assert closed_by_server(kept, 5)


def test_a_late_first_byte_or_empty_lines_do_not_extend_the_first_heads_deadline():
    """A connection's first head has its deadline from the moment the connection is made:
    a client that waits before its first byte gets no more time for the rest, nor one
    that sends empty lines ahead of its request (RFC 9112 §2.2 lets a server ignore them,
    not wait for them)."""
    with listening(hello, Limits(header_timeout=1.0)) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as late:
            time.sleep(0.7)
            late.sendall(b"GET /late HTTP/1.1\r\n")
            time.sleep(0.7)  # 1.4 s since it was made, 0.7 s since its first byte
            with contextlib.suppress(OSError):
                late.sendall(b"Host: x\r\n\r\n")
            assert until_closed(late) == b""
        with socket.create_connection(("127.0.0.1", port), timeout=5) as blank:
            for _ in range(8):  # an empty line every 0.25 s, for 2 s
                with contextlib.suppress(OSError):
                    blank.sendall(b"\r\n")
                time.sleep(0.25)
            with contextlib.suppress(OSError):
                blank.sendall(b"GET /blank HTTP/1.1\r\nHost: x\r\n\r\n")
            assert until_closed(blank) == b""


def test_a_request_pipelined_behind_connection_close_is_neither_made_nor_answered():
    """After a request with `Connection: close` the server reads no further request (RFC
    9112 §9.6): one pipelined behind it in the same bytes is not handled at all."""
    asked: list[str] = []

    def handler(request: Request) -> Response:
        asked.append(request.path)
        return hello(request)

    with listening(handler) as listener:
        answer = exchange(
            listener.server_address[1],
            b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
        )
    assert asked == ["/a"]
    assert answer.count(b"HTTP/1.1 ") == 1 and answer.endswith(b"Connection: close\r\n\r\nGET /a\n")


def test_a_kept_alive_connection_stalled_in_its_next_head_is_closed_and_logged(caplog):
    """The first byte of a kept-alive connection's next request starts that head's deadline
    (not the idle one's), and the line logged when it passes says why."""
    with (
        caplog.at_level("DEBUG", logger="collector.listener"),
        listening(hello, Limits(header_timeout=0.2)) as listener,
    ):
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as kept:
            kept.sendall(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(kept, bytearray())[1] == b"GET /one\n"
            kept.sendall(b"GET /two HT")
            assert closed_by_server(kept, 5)
    lines = [r.getMessage() for r in caplog.records if r.name == "collector.listener"]
    assert "closing the connection of 127.0.0.1: no whole request in time" in lines


def test_bytes_sent_while_an_answer_is_made_start_no_deadline_under_it():
    """A client that sends the start of its next request while its answer is being made
    gets that answer, however long past a head's deadline it takes: the next head's
    deadline starts once the answer is written."""
    release = threading.Event()

    def held(request: Request) -> Deferred:
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with listening(held, Limits(header_timeout=0.2)) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            try:
                client.sendall(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
                wait_until(lambda: listener.admission.in_flight == 1, 10, "in flight")
                client.sendall(b"GET /2 HT")
                time.sleep(0.6)  # three heads' deadlines
                release.set()
                assert read_answer(client, bytearray())[1] == b"held\n"
                assert closed_by_server(client, 5)  # then the second head's deadline
            finally:
                release.set()


def test_max_requests_answered_at_once_then_503():
    release = threading.Event()

    def held(request: Request) -> Deferred:
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with listening(held, Limits(max_requests=2)) as listener:
        port = listener.server_address[1]
        results: list[int] = []
        clients = [
            threading.Thread(target=lambda: results.append(request(port, "/")[0])) for _ in range(2)
        ]
        try:
            for client in clients:
                client.start()
            wait_until(lambda: listener.admission.in_flight == 2, 10, "two requests in flight")
            status, _, body = request(port, "/")
            assert status == 503 and b"--web.max-requests 2" in body
        finally:
            release.set()
            for client in clients:
                client.join(20)
        assert results == [200, 200]
        assert request(port, "/")[0] == 200
        wait_until(lambda: listener.admission.in_flight == 0, 10, "no request in flight")


def test_gates_hold_no_place_and_are_bounded_apart():
    """A gate (basic auth's bcrypt check) waiting holds no --web.max-requests place: a
    request answered at once still is; at most max_requests gates wait, one more is 503."""
    release = threading.Event()

    def handler(request: Request) -> Response | Deferred:
        if request.path == "/gate":
            return Deferred(lambda: (release.wait(20), Response(401, b"no\n"))[1], gate=True)
        return Response(200, b"ok\n")

    with listening(handler, Limits(max_requests=2)) as listener:
        port = listener.server_address[1]
        results: list[int] = []
        clients = [
            threading.Thread(target=lambda: results.append(request(port, "/gate")[0]))
            for _ in range(2)
        ]
        try:
            for client in clients:
                client.start()
            wait_until(lambda: listener.admission.gates == 2, 10, "two gates waiting")
            assert listener.admission.in_flight == 0
            assert request(port, "/")[0] == 200
            assert request(port, "/gate")[0] == 503
        finally:
            release.set()
            for client in clients:
                client.join(20)
        assert results == [401, 401]
        wait_until(lambda: listener.admission.gates == 0, 10, "no gate waiting")
        wait_until(lambda: listener.admission.in_flight == 0, 10, "no request in flight")


def pipelined_behind_one_in_flight(listener: Listener, client: socket.socket, path: str):
    """Send a request, and once it is in flight 500,000 requests for `path` behind it (as
    much as the kernel takes within the client's timeout); the server's connection."""
    client.sendall(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until(lambda: listener.admission.in_flight == 1, 10, "the first request in flight")
    with contextlib.suppress(TimeoutError):
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * 500_000)
    (connection,) = listener.connections
    return connection


def test_requests_pipelined_behind_one_in_flight_are_buffered_up_to_a_head():
    """While a request is answered, what the client sends after it waits in the kernel,
    not in the server's memory: reading pauses past one head's size."""
    release = threading.Event()

    def held(request: Request) -> Deferred:
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with listening(held) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
            try:
                connection = pipelined_behind_one_in_flight(listener, client, "/")
                assert len(connection.buffer) <= MAX_HEAD_BYTES + 256 * 1024
            finally:
                release.set()


def test_max_requests_0_is_no_bound_but_the_connections():
    release = threading.Event()

    def held(request: Request) -> Deferred:
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with listening(held, Limits(max_requests=0)) as listener:
        port = listener.server_address[1]
        results: list[int] = []
        clients = [
            threading.Thread(target=lambda: results.append(request(port, "/")[0])) for _ in range(3)
        ]
        try:
            for client in clients:
                client.start()
            wait_until(lambda: listener.admission.in_flight == 3, 10, "three requests in flight")
        finally:
            release.set()
            for client in clients:
                client.join(20)
        assert results == [200, 200, 200]


def test_a_response_not_taken_in_time_is_dropped_and_frees_its_place(caplog):
    """A client that asks and never reads holds its place among --web.max-requests only
    until the write deadline (1 s here, 30 s by default); the drop is logged, with why."""
    big = Response(200, b"x" * (32 << 20))  # more than the loopback's socket buffers hold
    with (
        caplog.at_level("DEBUG", logger="collector.listener"),
        listening(lambda request: big, Limits(write_timeout=1.0)) as listener,
    ):
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port)) as reader:
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(lambda: listener.admission.in_flight == 1, 10, "the response in flight")
            wait_until(lambda: listener.admission.in_flight == 0, 10, "its place freed")
            wait_until(lambda: listener.admission.connections == 0, 10, "its connection dropped")
    lines = [r.getMessage() for r in caplog.records if "closing the connection" in r.getMessage()]
    assert lines == ["closing the connection of 127.0.0.1: response not taken in time"]


def test_connections_beyond_the_bound_evict_the_longest_waiting():
    with listening(hello, Limits(max_connections=8)) as listener:
        port = listener.server_address[1]
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        try:
            wait_until(lambda: listener.admission.connections == 8, 10, "8 connections")
            assert request(port, "/")[0] == 200  # a 9th: the oldest idle one goes
            assert closed_by_server(idle[0], 5)
            assert not closed_by_server(idle[-1], 0.2)
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: listener.admission.connections == 0, 10, "all closed")
        assert not listener.admission.waiting


def test_a_handler_that_raises_is_a_500_and_the_listener_goes_on():
    def broken(request: Request) -> Response:
        if request.path == "/broken":
            raise RuntimeError("bug")
        return hello(request)

    with listening(broken) as listener:
        port = listener.server_address[1]
        assert request(port, "/broken")[0] == 500
        assert request(port, "/fine")[0] == 200


def test_failures_a_client_can_cause_are_logged_as_seldom_as_refusals(caplog):
    """A handler that raises is the server's fault, logged at error level, but a client
    who found how to make it cannot fill the log: one line every 10 s, the rest counted."""

    def broken(request: Request) -> Response:
        raise RuntimeError("bug")

    with caplog.at_level("ERROR"), listening(broken) as listener:
        port = listener.server_address[1]
        for _ in range(50):
            assert request(port, "/broken")[0] == 500
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 1 and "answering GET /broken failed: RuntimeError('bug')" in lines[0]


def test_refusals_are_logged_at_most_once_every_ten_seconds(caplog):
    now = [0.0]
    refusals = RefusalLog(monotonic=lambda: now[0])  # the default, as docs/deploy.md says
    with caplog.at_level("INFO", logger="collector.listener"):
        for second in range(25):
            now[0] = float(second)
            refusals.refused("10.0.0.1", "GET /metrics: 401")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3  # at 0, 10 and 20 s
    assert lines[0] == "refused 10.0.0.1: GET /metrics: 401"
    assert lines[1].endswith("(and 9 more refused since the last line)")


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


FLOOD = 5000
"""Idle connections opened on `procdelta serve`: more than its bound (4096)."""


def test_a_flood_of_idle_connections_leaves_scrapes_answered_and_nothing_behind():
    """5,000 idle connections on a real `serve`: its threads stay at their resting number
    (a connection holds no thread), its open sockets at the connection bound (the oldest
    waiting ones are closed), scrapes are answered within a second meanwhile; after the
    flood, threads and sockets are back to rest."""
    limits = raise_own_open_files_limit(FLOOD + 256)
    port = free_port()
    process = start_serve(port, interval="1")
    flood: list[socket.socket] = []
    try:
        wait_until(lambda: request(port, "/healthz")[0] == 200, 30, "healthy")
        serve = psutil.Process(process.pid)
        resting_threads, resting_sockets = serve.num_threads(), open_sockets(serve.pid)
        most_threads = resting_threads
        for i in range(FLOOD):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            if i % 500 == 0:
                most_threads = max(most_threads, serve.num_threads())
        for _ in range(5):
            began = time.monotonic()
            status, _, body = request(port, "/metrics")
            took = time.monotonic() - began
            assert status == 200 and b"procdelta_passes_total" in body
            assert took < 1.0, f"a scrape took {took:.2f}s under the flood"
            most_threads = max(most_threads, serve.num_threads())
        assert most_threads == resting_threads, (resting_threads, most_threads)
        assert open_sockets(serve.pid) <= resting_sockets + 4096 + 8
        for sock in flood:
            sock.close()
        wait_until(lambda: open_sockets(serve.pid) <= resting_sockets, 30, "sockets closed")
        assert serve.num_threads() == resting_threads
        assert request(port, "/metrics")[0] == 200
    finally:
        for sock in flood:
            sock.close()
        process.terminate()
        _, stderr = process.communicate(timeout=30)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    assert "Traceback" not in stderr


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


def test_an_answers_head_is_its_status_type_length_and_headers_in_order():
    """The status line (a status with no reason phrase of its own is `Unknown`), the
    type, the length, nosniff, the handler's own headers, and `Connection: close` only on
    the answer after which the connection closes."""

    def custom(request: Request) -> Response:
        return Response(299, b"abc", content_type="x/y", headers=(("A", "b"), ("C", "d")))

    with listening(custom) as listener:
        answer = exchange(
            listener.server_address[1],
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    kept = (
        b"HTTP/1.1 299 Unknown\r\nContent-Type: x/y\r\nContent-Length: 3\r\n"
        b"X-Content-Type-Options: nosniff\r\nA: b\r\nC: d\r\n"
    )
    assert answer == kept + b"\r\nabc" + kept + b"Connection: close\r\n\r\nabc"


def test_a_large_answer_read_late_arrives_whole_and_the_connection_goes_on():
    """An answer larger than the socket's buffers pauses the writing until the client reads
    it; read late but within the write deadline, it arrives whole and its place among
    --web.max-requests is freed; the request pipelined behind it is answered next, and a
    large answer to `Connection: close` closes the connection once taken."""
    big = b"0123456789abcdef" * (1 << 20)  # 16 MiB: more than the loopback's buffers hold

    def handler(request: Request) -> Response:
        return Response(200, big if request.path == "/big" else b"small\n")

    with listening(handler, Limits(max_requests=1)) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            rest = bytearray()
            sock.sendall(
                b"GET /big HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            wait_until(lambda: listener.admission.in_flight == 1, 10, "the answer in flight")
            time.sleep(0.3)  # the server has filled the socket and waits for it to drain
            assert listener.admission.in_flight == 1
            head, body = read_answer(sock, rest)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == big
            head, body = read_answer(sock, rest)
            assert b"Connection: close" not in head and body == b"small\n"
            wait_until(lambda: listener.admission.in_flight == 0, 10, "its place freed")
            assert not closed_by_server(sock, 0.2)
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            time.sleep(0.3)
            head, body = read_answer(sock, rest)
            assert head.endswith(b"\r\nConnection: close") and body == big and not rest
            assert closed_by_server(sock, 5)


def test_what_the_event_loop_reports_is_one_line_at_debug_unless_the_servers_own(caplog):
    """What asyncio would print with a traceback: an error of the system's (an accept that
    hit the open files limit) one line at debug level, any other an error with its repr."""
    with caplog.at_level("DEBUG", logger="collector.listener"), listening(hello) as listener:
        assert request(listener.server_address[1], "/")[0] == 200  # the loop runs
        listener.loop.call_exception_handler(
            {"message": "socket.accept() out of system resource",
             "exception": OSError(24, "Too many open files")}
        )  # fmt: skip
        listener.loop.call_exception_handler({"message": "a note"})
        listener.loop.call_exception_handler(
            {"message": "a callback failed", "exception": ValueError("bug")}
        )
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "listener:" in r.getMessage()]
    assert lines == [
        (
            "DEBUG",
            "listener: socket.accept() out of system resource [Errno 24] Too many open files",
        ),
        ("DEBUG", "listener: a note "),
        ("ERROR", "listener: a callback failed: ValueError('bug')"),
    ]


def test_failures_are_counted_into_the_next_line_as_refusals_are(caplog):
    """The server's own failures, one error line every 10 s at most: the first alone, the
    next with the count of those held back."""
    now = [0.0]
    failures = RefusalLog(every=10, monotonic=lambda: now[0])
    with caplog.at_level("ERROR", logger="collector.listener"):
        for second in range(25):
            now[0] = float(second)
            failures.failed(f"failure at {second}")
    assert [r.getMessage() for r in caplog.records] == [
        "failure at 0",
        "failure at 10 (and 9 more failures since the last line)",
        "failure at 20 (and 9 more failures since the last line)",
    ]


def test_a_refusal_says_why_in_one_line_closes_and_is_logged_with_the_client(caplog):
    """A malformed request is answered with the reason as one line of text, says it closes
    (`Connection: close`) and does; the log names the client and the reason."""
    with caplog.at_level("INFO", logger="collector.listener"), listening(hello) as listener:
        answer = exchange(listener.server_address[1], b"GARBAGE\r\n\r\nGET / HTTP/1.0\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert head.endswith(b"\r\nConnection: close") and body == b"malformed request line\n"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused 127.0.0.1: 400: malformed request line"]


def test_a_request_turned_away_is_503_closed_and_logged(caplog):
    """Past --web.max-requests, a request is answered 503 (a HEAD without the body), the
    connection closed with it (a request pipelined behind is not read), the client logged."""
    release = threading.Event()

    def held(request: Request) -> Response | Deferred:
        if request.path == "/held":
            return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])
        return hello(request)

    with (
        caplog.at_level("INFO", logger="collector.listener"),
        listening(held, Limits(max_requests=1)) as listener,
    ):
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as holder:
            try:
                holder.sendall(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
                wait_until(lambda: listener.admission.in_flight == 1, 10, "one request in flight")
                turned = exchange(
                    port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
                )
                head_only = exchange(port, b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
            finally:
                release.set()
    head, _, body = turned.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert head.endswith(b"\r\nConnection: close")
    assert body == b"too many requests at once (--web.max-requests 1); try again later\n"
    assert head_only.startswith(b"HTTP/1.1 503 ") and head_only.endswith(b"\r\n\r\n")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert lines[0] == "refused 127.0.0.1: 503: --web.max-requests reached"


@pytest.mark.parametrize("kind", ["held", "gate", "aside"])
def test_a_deferred_answer_that_raises_is_a_500_and_the_connection_goes_on(caplog, kind):
    """Work done in a worker thread (a view, a bcrypt check) that raises: a 500 saying
    `internal error`, logged as the server's failure with the request's method and path
    (cut to 64 characters); the request pipelined behind it is answered on the same
    connection, and `Connection: close` closes it after."""
    path = "/" + "p" * 99

    def work() -> Response:
        raise RuntimeError("bug")

    def handler(request: Request) -> Response | Deferred:
        if request.path == path:
            return Deferred(work, gate=kind == "gate", aside=kind == "aside")
        return hello(request)

    with caplog.at_level("ERROR", logger="collector.listener"), listening(handler) as listener:
        answer = exchange(
            listener.server_address[1],
            f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            + f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            + b"GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    failed = b"HTTP/1.1 500 Internal Server Error\r\n"
    assert answer.count(failed) == 2 and answer.count(b"\r\n\r\ninternal error\n") == 2
    assert answer.endswith(b"Connection: close\r\n\r\nGET /after\n")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == f"answering GET {path[:64]}… failed: RuntimeError('bug')"


def test_checks_and_views_each_run_in_the_listeners_own_worker():
    """A gate (a bcrypt check) runs in the listener's `auth` thread, one at a time; an
    answer made aside or on request (a view) in its `views` thread, not in asyncio's
    default pool."""
    threads: dict[str, str] = {}

    def handler(request: Request) -> Deferred:
        def work() -> Response:
            threads[request.path] = threading.current_thread().name
            return Response(200, b"made\n")

        kind = request.path[1:]
        return Deferred(work, gate=kind == "gate", aside=kind == "aside")

    with listening(handler) as listener:
        port = listener.server_address[1]
        for kind in ("gate", "aside", "held"):
            assert request(port, f"/{kind}")[0] == 200
    assert threads["/gate"].startswith("auth")
    assert threads["/aside"].startswith("views") and threads["/held"].startswith("views")


def test_checks_run_one_at_a_time_and_views_one_at_a_time():
    """The `auth` and `views` workers are one thread each: wrong passwords cost one CPU
    at most, and views made at once share no GIL they would fight for."""
    running = {"auth": 0, "views": 0}
    most = dict(running)
    lock = threading.Lock()

    def handler(request: Request) -> Deferred:
        gate = request.path == "/gate"
        pool = "auth" if gate else "views"

        def work() -> Response:
            with lock:
                running[pool] += 1
                most[pool] = max(most[pool], running[pool])
            time.sleep(0.2)
            with lock:
                running[pool] -= 1
            return Response(200, b"made\n")

        return Deferred(work, gate=gate, aside=request.path == "/aside")

    with listening(handler) as listener:
        port = listener.server_address[1]
        statuses: list[int] = []
        clients = [
            threading.Thread(target=lambda path=path: statuses.append(request(port, path)[0]))
            for path in ("/gate", "/gate", "/gate", "/aside", "/aside", "/held")
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(20)
    assert statuses == [200] * 6
    assert most == {"auth": 1, "views": 1}  # /aside and /held are both views


@pytest.mark.parametrize(
    ("soft", "bound"),
    [(1000, 936), (80, 16), (resource.RLIM_INFINITY, Limits().max_connections)],
)
def test_connections_are_bounded_below_the_open_files_limit(monkeypatch, soft, bound):
    """64 descriptors below the soft open files limit (16 at least), so that evicting a
    connection comes before accept() fails."""
    real = resource.getrlimit
    monkeypatch.setattr(
        resource,
        "getrlimit",
        lambda which: (soft, real(which)[1]) if which == resource.RLIMIT_NOFILE else real(which),
    )
    listener = Listener(socket.socket(), hello)
    monkeypatch.undo()
    try:
        assert listener.limits.max_connections == min(bound, Limits().max_connections)
    finally:
        listener.server_close()


def test_the_listening_socket_queues_1024_connections_not_yet_accepted():
    """A burst of scrapers and probes waits in the kernel's queue, not refused: the queue
    the listener asks for (`ss` reads it back as Send-Q of a listening socket)."""
    with listening(hello) as listener:
        port = listener.server_address[1]
        assert request(port, "/")[0] == 200  # serving
        shown = subprocess.run(
            [tool("ss", "iproute2"), "-ltnH", f"sport = :{port}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    assert shown[:3] == ["LISTEN", "0", "1024"], shown


def test_shutdown_while_answers_are_made_and_connections_open_returns_cleanly():
    """`shutdown` with a connection idle and an answer being made in a worker: the
    connections are closed, the answer's task cancelled, and `serve_forever` returns
    without raising (`listening` checks it)."""
    release = threading.Event()

    def held(request: Request) -> Deferred:
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with (
        listening(held) as listener,
        socket.create_connection(("127.0.0.1", listener.server_address[1]), timeout=10) as busy,
        socket.create_connection(("127.0.0.1", listener.server_address[1]), timeout=10) as idle,
    ):
        try:
            busy.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(lambda: listener.admission.in_flight == 1, 10, "an answer being made")
            wait_until(lambda: len(listener.connections) == 2, 10, "two connections")
            listener.shutdown()
            assert closed_by_server(idle, 5) and closed_by_server(busy, 5)
        finally:
            release.set()


def test_a_connection_accepted_as_the_listener_stops_is_dropped_cleanly():
    """asyncio makes a connection's protocol, and gives it its transport a turn of the
    loop later: a stop in between aborts every connection the listener knows, that one
    without a transport yet, and `serve_forever` still returns cleanly (`listening`)."""
    with listening(hello) as listener:
        listener.loop.call_soon_threadsafe(listener._protocol)
        wait_until(lambda: len(listener.connections) == 1, 10, "a connection made")
        (connection,) = listener.connections
        assert connection.transport is None


def test_a_shutdown_waits_for_nothing():
    """Once stopped, serve_forever gives the cancelled tasks one turn of the loop and
    waits no time: the quickest of three shutdowns of an idle listener is far under a
    second (a sleep of one there would make each take a whole second)."""
    spans = []
    for _ in range(3):
        with listening(hello) as listener:
            began = time.monotonic()
            listener.shutdown()
            spans.append(time.monotonic() - began)
    assert min(spans) < 0.9, spans


def test_a_stop_asked_while_the_server_is_being_made_takes_effect_once_it_is_made():
    """SIGTERM as `serve` starts: a shutdown while the listening server is being made
    waits for it (stopping the loop then would cut the making short, and serve_forever
    raise), then stops it; serve_forever returns cleanly (`listening` checks it)."""
    making, go = threading.Event(), threading.Event()

    def made_slowly(listener: Listener) -> None:
        make = listener.loop.create_server

        async def slowly(*args, **kwargs):
            making.set()
            await asyncio.to_thread(go.wait, 10)
            return await make(*args, **kwargs)

        listener.loop.create_server = slowly

    try:
        with listening(hello, prepare=made_slowly) as listener:
            assert making.wait(10)
            stopping = threading.Thread(target=listener.shutdown, daemon=True)
            stopping.start()
            time.sleep(0.2)  # the stop asked, the server still being made
            assert stopping.is_alive()
            go.set()
            stopping.join(10)
            assert not stopping.is_alive()
    finally:
        go.set()


def test_a_stop_asked_before_serving_begins_makes_it_return_at_once():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        listener = Listener(sock, hello)
        listener.shutdown()
        serving = threading.Thread(target=listener.serve_forever, daemon=True)
        serving.start()
        serving.join(10)
        assert not serving.is_alive()
        listener.server_close()


def test_an_answer_is_buffered_up_to_256_kib_before_the_server_waits_for_the_client():
    """Each connection's write buffer: writing waits for a slow reader once 256 KiB of
    answers are buffered (and goes on below 64 KiB), which with `--web.max-requests`
    bounds what slow readers make the server hold."""
    with (
        listening(hello) as listener,
        socket.create_connection(("127.0.0.1", listener.server_address[1]), timeout=10),
    ):
        wait_until(lambda: any(c.transport is not None for c in listener.connections), 10, "made")
        (connection,) = listener.connections
        assert connection.transport.get_write_buffer_limits() == (64 * 1024, 256 * 1024)


@pytest.mark.parametrize(("check", "view"), [(0.6, 0.1), (0.1, 0.6)])
def test_server_close_waits_for_the_work_in_flight_and_leaves_no_descriptor(check, view):
    """`server_close` returns once the checks and views being made have ended (nothing
    runs past it, whichever ends last), and with the event loop's descriptors closed."""
    before = len(os.listdir("/proc/self/fd"))
    ended: list[str] = []

    def handler(request: Request) -> Deferred:
        def work() -> Response:
            time.sleep(check if request.path == "/gate" else view)
            ended.append(request.path)
            return Response(200, b"made\n")

        return Deferred(work, gate=request.path == "/gate", aside=request.path == "/aside")

    with contextlib.ExitStack() as clients:
        with listening(handler) as listener:
            port = listener.server_address[1]
            for path in ("/gate", "/aside"):
                client = clients.enter_context(socket.create_connection(("127.0.0.1", port)))
                client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            wait_until(lambda: listener.admission.gates == 1, 10, "a check being made")
            wait_until(lambda: listener.admission.aside == 1, 10, "a view being made")
        assert sorted(ended) == ["/aside", "/gate"]
        assert listener.loop.is_closed()
    assert len(os.listdir("/proc/self/fd")) == before


def test_each_place_taken_is_given_back_once_its_answer_is_made_and_written():
    """Every answer gives back the place it took, whatever its kind: after a gate, a view
    made aside, an answer made on request and one written at once, one at a time and
    more than each bound, nothing is counted in flight, waiting or aside."""

    def handler(request: Request) -> Response | Deferred:
        kind = request.path[1:]
        if kind == "now":
            return Response(200, b"now\n")
        return Deferred(lambda: Response(200, b"made\n"), gate=kind == "gate",
                        aside=kind == "aside")  # fmt: skip

    with listening(handler, Limits(max_requests=2)) as listener:
        port = listener.server_address[1]
        admission = listener.admission
        for kind in ("gate", "aside", "held", "now") * (MAX_ASIDE + 1):
            assert request(port, f"/{kind}")[0] == 200
            wait_until(
                lambda: (admission.in_flight, admission.gates, admission.aside) == (0, 0, 0),
                10,
                f"every place given back after /{kind}",
            )


def test_a_connection_cut_by_the_server_is_logged_with_why_unless_merely_idle(caplog):
    """At debug level: a connection without a whole request by the head's deadline, and
    one evicted by a newer past the connection bound, are logged with the client and why;
    a kept-alive connection closed after its idle wait is not (nothing went wrong), nor is
    one the client closed."""
    limits = Limits(header_timeout=1.0, idle_timeout=0.5, max_connections=2)
    with (
        caplog.at_level("DEBUG", logger="collector.listener"),
        listening(hello, limits) as listener,
    ):
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port)) as silent:
            assert closed_by_server(silent, 5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as kept:
            kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(kept, bytearray())[1] == b"GET /\n"
            assert closed_by_server(kept, 5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as partial:
            # the start of a second request sent with the first: its head's deadline runs
            partial.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n")
            assert read_answer(partial, bytearray())[1] == b"GET /\n"
            assert closed_by_server(partial, 5)
        with (
            socket.create_connection(("127.0.0.1", port)) as oldest,
            socket.create_connection(("127.0.0.1", port)) as newer,
        ):
            wait_until(lambda: listener.admission.connections == 2, 5, "two connections")
            with socket.create_connection(("127.0.0.1", port)):
                assert closed_by_server(oldest, 0.5)
                assert not closed_by_server(newer, 0.1)
        wait_until(lambda: listener.admission.connections == 0, 5, "all closed")
    lines = [r.getMessage() for r in caplog.records if "closing the connection" in r.getMessage()]
    assert lines == [
        "closing the connection of 127.0.0.1: no whole request in time",
        "closing the connection of 127.0.0.1: no whole request in time",
        "closing the connection of 127.0.0.1: evicted: too many connections",
    ]


@pytest.mark.parametrize("kind", ["held", "gate", "aside"])
def test_a_deferred_answer_to_connection_close_says_so_and_closes(kind):
    """An answer made in a worker thread to a request with `Connection: close` says it
    closes, and does: what the client pipelined behind it is not answered."""

    def handler(request: Request) -> Deferred:
        return Deferred(
            lambda: Response(200, b"made\n"), gate=kind == "gate", aside=kind == "aside"
        )

    with listening(handler) as listener:
        answer = exchange(
            listener.server_address[1],
            b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
        )
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 1
    assert answer.endswith(b"\r\nConnection: close\r\n\r\nmade\n")


def test_an_answer_before_closing_not_taken_is_dropped_at_the_write_deadline(caplog):
    """An answer to `Connection: close` small enough to be written at once but left unread
    (in the server's buffer, past the kernel's): the connection is held until the write
    deadline, not dropped before, then dropped and logged."""
    answer = Response(200, b"x" * (200 * 1024))  # under the transport's 256 KiB mark
    limits = Limits(write_timeout=1.5)
    with (
        caplog.at_level("DEBUG", logger="collector.listener"),
        listening(lambda request: answer, limits, sndbuf=4096) as listener,
        socket.socket() as reader,
    ):
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(listener.server_address)
        reader.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        wait_until(lambda: listener.admission.in_flight == 0, 5, "the answer written")
        began = time.monotonic()
        time.sleep(0.5)
        assert listener.admission.connections == 1, "dropped before the write deadline"
        wait_until(lambda: listener.admission.connections == 0, 10, "dropped at the deadline")
        assert 1.0 < time.monotonic() - began < 5
    lines = [r.getMessage() for r in caplog.records if "closing the connection" in r.getMessage()]
    assert lines == ["closing the connection of 127.0.0.1: response not taken"]


@pytest.mark.parametrize("held", [False, True])
def test_a_client_that_ends_its_sending_gets_its_answer_then_the_end(held):
    """A client that sends its request and shuts its side (half-close) still gets the
    answer, made at once or in a worker, and then the connection closes."""

    def handler(request: Request) -> Response | Deferred:
        if held:
            return Deferred(lambda: (time.sleep(0.3), Response(200, b"made\n"))[1])
        return Response(200, b"made\n")

    with (
        listening(handler) as listener,
        socket.create_connection(listener.server_address, timeout=5) as sock,
    ):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        head, body = read_answer(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == b"made\n"
        assert closed_by_server(sock, 2)


def test_a_401_answer_is_logged_as_a_refusal_and_no_other_answer_is(caplog):
    """A request answered 401 (a wrong password) is logged with the client, method and
    path; an answer of another status is not."""

    def handler(request: Request) -> Response:
        return Response(401 if request.path == "/secret" else 200, b"no\n")

    with caplog.at_level("INFO", logger="collector.listener"), listening(handler) as listener:
        port = listener.server_address[1]
        assert request(port, "/open")[0] == 200
        assert request(port, "/secret")[0] == 401
    assert [r.getMessage() for r in caplog.records] == ["refused 127.0.0.1: GET /secret: 401"]


def test_a_client_gone_before_its_answer_is_made_frees_its_place_once():
    """A client that leaves (a reset) while its answer is made in a worker: the answer is
    dropped and its place among --web.max-requests freed once, so the bound still holds
    after."""
    releases = [threading.Event() for _ in range(3)]
    started = iter(releases)

    def held(request: Request) -> Deferred:
        release = next(started)
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with listening(held, Limits(max_requests=1)) as listener:
        port = listener.server_address[1]
        try:
            with socket.create_connection(("127.0.0.1", port)) as gone:
                gone.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                wait_until(lambda: listener.admission.in_flight == 1, 10, "its answer being made")
                gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            wait_until(lambda: listener.admission.connections == 0, 10, "the client gone")
            releases[0].set()
            wait_until(lambda: listener.admission.in_flight == 0, 10, "its place freed")
            time.sleep(0.2)
            assert not listener.admission.waiting  # not waiting for a next request either
            with socket.create_connection(("127.0.0.1", port), timeout=10) as waiting:
                waiting.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                wait_until(lambda: listener.admission.in_flight == 1, 10, "the next one in flight")
                assert request(port, "/")[0] == 503  # the bound of 1 holds
                releases[1].set()
                assert read_answer(waiting, bytearray())[1] == b"held\n"
        finally:
            for release in releases:
                release.set()


def test_reading_pauses_behind_a_request_in_flight_only_past_one_heads_size():
    """What a client sends while its request is answered is read up to one head's size
    (64 KiB), and the reading pauses at the byte past it; it resumes once the answer is
    written (that head, too large, is then refused)."""
    release = threading.Event()

    def held(request: Request) -> Deferred:
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with listening(held) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            try:
                client.sendall(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
                wait_until(lambda: listener.admission.in_flight == 1, 10, "in flight")
                (connection,) = listener.connections
                start = b"GET /2 HTTP/1.1\r\nHost: x\r\nX: "
                client.sendall(start + b"a" * (MAX_HEAD_BYTES - len(start)))
                wait_until(lambda: len(connection.buffer) == MAX_HEAD_BYTES, 10, "a head read")
                assert not connection.paused
                client.sendall(b"a")
                wait_until(lambda: connection.paused, 10, "the reading paused")
                release.set()
                rest = bytearray()
                assert read_answer(client, rest)[1] == b"held\n"
                head, body = read_answer(client, rest)
                assert head.startswith(b"HTTP/1.1 431 ") and body == b"request head too large\n"
            finally:
                release.set()


def test_a_fault_of_the_servers_own_while_reading_drops_that_connection_only(caplog, monkeypatch):
    """An exception raised by the server's own code while it reads a request (a bug, no
    client's fault) aborts that connection with one line at debug level, no traceback; the
    listener goes on."""

    def broken(self: Heads) -> None:
        raise RuntimeError("boom")

    with (
        caplog.at_level("DEBUG", logger="collector.listener"),
        listening(hello) as listener,
    ):
        port = listener.server_address[1]
        monkeypatch.setattr(Heads, "take", broken)
        assert exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""
        monkeypatch.undo()
        assert request(port, "/")[0] == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "collector.listener"]
    assert "request from 127.0.0.1 dropped: RuntimeError('boom')" in lines
    assert not any(r.exc_info for r in caplog.records)


def test_reading_pauses_again_for_each_request_answered_with_more_behind():
    """The pause of the reading past one head's size is not spent once: after the first
    request is answered and reading resumes, the next in flight pauses it again."""
    first, rest = threading.Event(), threading.Event()
    taken = []

    def held(request: Request) -> Deferred:
        release = rest if taken else first
        taken.append(request.path)
        return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])

    with listening(held) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
            try:
                connection = pipelined_behind_one_in_flight(listener, client, "/2")
                first.set()
                wait_until(lambda: len(taken) == 2, 10, "the second request taken")
                time.sleep(0.5)
                assert len(connection.buffer) <= MAX_HEAD_BYTES + 256 * 1024
            finally:
                first.set()
                rest.set()


def test_a_connection_mid_request_is_not_evicted_for_a_newer_one():
    """Past the connection bound, the connection evicted is the one waiting longest for a
    request, never an older one whose request is being answered: it gets its answer."""
    release = threading.Event()

    def held(request: Request) -> Response | Deferred:
        if request.path == "/held":
            return Deferred(lambda: (release.wait(20), Response(200, b"held\n"))[1])
        return hello(request)

    with listening(held, Limits(max_connections=2)) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as busy:
            try:
                busy.sendall(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
                wait_until(lambda: listener.admission.in_flight == 1, 10, "a request in flight")
                with socket.create_connection(("127.0.0.1", port)) as idle:
                    wait_until(lambda: listener.admission.connections == 2, 10, "two connections")
                    with socket.create_connection(("127.0.0.1", port)):
                        assert closed_by_server(idle, 5)
                    release.set()
                    assert read_answer(busy, bytearray())[1] == b"held\n"
            finally:
                release.set()


class _Unnamed(asyncio.Transport):
    """A transport whose client left before its address was read (`peername` None)."""

    aborted = False

    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def abort(self):
        self.aborted = True


def test_a_client_gone_before_its_address_is_read_is_named_by_a_question_mark(caplog):
    """asyncio gives no `peername` for a client that reset its connection before it was
    read: the connection goes on, and the log names its client `?`."""
    transport = _Unnamed()
    made: concurrent.futures.Future[None] = concurrent.futures.Future()
    with (
        caplog.at_level("DEBUG", logger="collector.listener"),
        listening(hello, Limits(header_timeout=0.05)) as listener,
    ):

        def connect() -> None:
            try:
                listener._protocol().connection_made(transport)
                made.set_result(None)
            except Exception as error:
                made.set_exception(error)

        listener.loop.call_soon_threadsafe(connect)
        made.result(5)
        wait_until(lambda: transport.aborted, 5, "the head's deadline")
    lines = [r.getMessage() for r in caplog.records if r.name == "collector.listener"]
    assert "closing the connection of ?: no whole request in time" in lines


def test_a_connection_that_begins_its_next_request_is_evicted_after_one_silent_since():
    """A connection answered and idle that starts its next request waits anew, as the
    newest: past the bound, one that has sent nothing since it came is evicted first."""
    with listening(hello, Limits(max_connections=2)) as listener:
        port = listener.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as talking:
            talking.sendall(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
            rest = bytearray()
            assert read_answer(talking, rest)[1] == b"GET /one\n"
            with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
                wait_until(lambda: listener.admission.connections == 2, 10, "two connections")
                talking.sendall(b"GET /two HT")
                wait_until(
                    lambda: any(len(c.buffer) for c in list(listener.admission.waiting)),
                    10,
                    "the next request begun",
                )
                with socket.create_connection(("127.0.0.1", port)):
                    assert closed_by_server(silent, 5)
            talking.sendall(b"TP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(talking, rest)[1] == b"GET /two\n"


@pytest.mark.parametrize(
    ("kind", "waiting", "said", "logged"),
    [
        ("gate", 1, b"too many requests at once (--web.max-requests 1)", "too many checks waiting"),
        ("aside", MAX_ASIDE, b"too many views at once (4)", "too many views waiting"),
    ],
)
def test_checks_and_views_past_their_bound_are_503_saying_which(
    caplog, kind, waiting, said, logged
):
    """One gate more than --web.max-requests waiting, one view more than MAX_ASIDE being
    made: 503 at once, the text and the log line saying which bound was met."""
    release = threading.Event()

    def handler(request: Request) -> Deferred:
        work = lambda: (release.wait(20), Response(200, b"made\n"))[1]  # noqa: E731
        return Deferred(work, gate=kind == "gate", aside=kind == "aside")

    with (
        caplog.at_level("INFO", logger="collector.listener"),
        listening(handler, Limits(max_requests=1)) as listener,
    ):
        port = listener.server_address[1]
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(waiting)]
        try:
            for sock in held:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            count = (
                (lambda: listener.admission.gates)
                if kind == "gate"
                else (lambda: listener.admission.aside)
            )
            wait_until(lambda: count() == waiting, 10, "the bound reached")
            status, _, body = request(port, "/")
            assert status == 503 and body.startswith(said)
        finally:
            release.set()
            for sock in held:
                sock.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"refused 127.0.0.1: 503: {logged}"]


def test_a_method_or_body_refused_is_told_what_is_served():
    """A method other than GET and HEAD: 405, `Allow: GET, HEAD`, and so in words; a
    request with a body: 413 in words; an empty Content-Length is malformed (400)."""
    with listening(hello) as listener:
        port = listener.server_address[1]
        wrong = exchange(port, b"PUT / HTTP/1.1\r\nHost: x\r\n\r\n")
        body = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
        empty = exchange(
            port, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\nConnection: close\r\n\r\n"
        )
    head, _, text = wrong.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"\r\nAllow: GET, HEAD\r\n" in head and text == b"GET or HEAD only\n"
    assert body.startswith(b"HTTP/1.1 413 Content Too Large\r\n")
    assert body.endswith(b"\r\n\r\na request body is not accepted\n")
    assert empty.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert empty.endswith(b"malformed Content-Length\n")


def test_a_connection_closing_with_its_answer_unsent_is_not_evicted():
    """A client that half-closes after its request, its answer still in the server's
    buffer: the connection closes once the answer is sent (or at the write deadline), and
    a newer connection past the bound evicts one waiting for a request, not it."""
    answer = Response(200, b"x" * (200 * 1024))  # under the transport's 256 KiB mark
    with (
        listening(lambda request: answer, Limits(max_connections=2), sndbuf=4096) as listener,
        socket.socket() as reader,
    ):
        port = listener.server_address[1]
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.settimeout(10)
        reader.connect(listener.server_address)
        reader.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reader.shutdown(socket.SHUT_WR)
        wait_until(lambda: listener.admission.in_flight == 0, 5, "the answer written")
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as idle:
            wait_until(lambda: listener.admission.connections == 2, 5, "two connections")
            with socket.create_connection(("127.0.0.1", port)):
                assert closed_by_server(idle, 5)
        head, body = read_answer(reader, bytearray())
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == answer.body
        assert closed_by_server(reader, 5)


# -- no client takes the loop ----------------------------------------------------------------


def test_a_connections_pipeline_is_answered_a_few_requests_a_turn():
    """A client that pipelines thousands of small requests in one write is answered at
    most PIPELINED_PER_TURN of them in one turn of the event loop; every other connection's
    callbacks run between (a ticker re-scheduling itself once a turn counts the turns)."""
    from collector.listener import PIPELINED_PER_TURN

    turns = [0]
    answered_in: list[int] = []

    def counted(request: Request) -> Response:
        answered_in.append(turns[0])
        return hello(request)

    with listening(counted) as listener:

        def tick() -> None:
            turns[0] += 1
            if len(answered_in) < 400:
                listener.loop.call_soon(tick)

        listener.loop.call_soon_threadsafe(tick)
        pipeline = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 399
        answer = exchange(
            listener.server_address[1],
            pipeline + b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            timeout=20,
        )
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 400
    per_turn = collections.Counter(answered_in)
    assert max(per_turn.values()) <= PIPELINED_PER_TURN, per_turn.most_common(3)


def test_a_pipeline_half_closed_by_its_client_is_answered_whole():
    """A client that writes its pipeline and shuts its side (EOF) is answered every
    request, though they take several turns, then closed."""
    with (
        listening(hello) as listener,
        socket.create_connection(("127.0.0.1", listener.server_address[1]), timeout=10) as sock,
    ):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
        sock.shutdown(socket.SHUT_WR)
        answer = until_closed(sock)
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 50


def test_writes_stop_once_the_client_resets_the_connection(caplog, monkeypatch):
    """Pipeline thousands of requests, then reset: asyncio marks the transport closing at
    the first failed write, and nothing more is written to it (else asyncio logs
    `socket.send() raised exception.` for each write past its fifth). Every request is
    answered in one turn here, as a connection's turn would be if it were longer."""
    import collector.listener

    monkeypatch.setattr(collector.listener, "PIPELINED_PER_TURN", 100_000)
    asyncio_logger = logging.getLogger("asyncio")
    bound = [f for f in asyncio_logger.filters if isinstance(f, Seldom)]
    with listening(hello) as listener:
        for f in bound:  # this test sees every line asyncio logs
            asyncio_logger.removeFilter(f)
        try:
            with caplog.at_level("WARNING", logger="asyncio"):
                for _ in range(5):
                    sock = socket.create_connection(("127.0.0.1", listener.server_address[1]))
                    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 8000)
                    sock.recv(1)  # the server is answering the pipeline: reset it now
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.close()
                time.sleep(0.5)
                assert request(listener.server_address[1], "/after")[0] == 200
        finally:
            for f in bound:
                asyncio_logger.addFilter(f)
    sends = [r for r in caplog.records if "socket.send() raised" in r.getMessage()]
    assert not sends, len(sends)


def test_asyncio_logs_are_held_to_the_refusal_logs_bound():
    """Whatever asyncio itself logs reaches the log at most once every 10 s, the rest
    counted into the next line."""
    now = [0.0]
    seldom = Seldom(every=10, monotonic=lambda: now[0])

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.WARNING, __file__, 1, text, None, None)

    first = record("socket.send() raised exception.")
    assert seldom.filter(first)
    assert not any(seldom.filter(record("socket.send() raised exception.")) for _ in range(500))
    now[0] = 10.0
    later = record("socket.send() raised exception.")
    assert seldom.filter(later)
    assert later.getMessage().endswith("(and 500 more held back since the last line)")
    assert any(isinstance(f, Seldom) for f in logging.getLogger("asyncio").filters)


def test_a_head_of_too_many_fields_is_refused_with_431():
    with listening(hello) as listener:
        answer = exchange(
            listener.server_address[1],
            b"GET / HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * 16_000 + b"\r\n",
        )
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")


def test_what_a_client_sent_reaches_the_log_as_printable_text(caplog):
    """A path holding a terminal's escape sequences (ESC, OSC, a C1 CSI) is logged escaped
    in the line naming a 401: an operator's terminal shows it, never obeys it."""

    def unauthorized(request: Request) -> Response:
        return Response(401, b"unauthorized\n")

    with (
        caplog.at_level("INFO", logger="collector.listener"),
        listening(unauthorized) as listener,
    ):
        answer = exchange(
            listener.server_address[1],
            b"GET /\x1b]0;owned\x07\x1b[2J\x9b31m HTTP/1.1\r\nHost: x\r\n\r\n",
        )
    assert answer.startswith(b"HTTP/1.1 401 ")
    (line,) = [r.getMessage() for r in caplog.records if "401" in r.getMessage()]
    assert "\x1b" not in line and "\x9b" not in line and "\x07" not in line
    assert "/\\x1b]0;owned\\x07\\x1b[2J\\x9b31m" in line
