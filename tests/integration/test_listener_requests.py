"""What the listener reads and answers (collector/listener.py with collector/http11.py, over
127.0.0.1): a head read whole however it comes, pipelines answered in order, what a request
may not be refused with its status, and the answer's head. Every socket and server a test
makes is closed when it ends, failed or not."""

from __future__ import annotations

import collections
import socket
import threading
import time

import pytest

from collector.admission import Deferred, Limits
from collector.http11 import MAX_HEAD_BYTES, Request, Response
from tests.listening import (
    closed_by_server,
    exchange,
    hello,
    listening,
    pipelined_behind_one_in_flight,
    read_answer,
    until_closed,
)
from tests.net import request, wait_until


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


def test_a_handler_that_raises_is_a_500_and_the_listener_goes_on():
    def broken(request: Request) -> Response:
        if request.path == "/broken":
            raise RuntimeError("bug")
        return hello(request)

    with listening(broken) as listener:
        port = listener.server_address[1]
        assert request(port, "/broken")[0] == 500
        assert request(port, "/fine")[0] == 200


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


def test_a_connections_pipeline_is_answered_a_few_requests_a_turn():
    """A client that pipelines thousands of small requests in one write is answered at
    most PIPELINED_PER_TURN of them in one turn of the event loop; every other connection's
    callbacks run between (a ticker re-scheduling itself once a turn counts the turns)."""
    from collector.admission import PIPELINED_PER_TURN

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


def test_a_head_of_too_many_fields_is_refused_with_431():
    with listening(hello) as listener:
        answer = exchange(
            listener.server_address[1],
            b"GET / HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * 16_000 + b"\r\n",
        )
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
