"""What the listener logs (collector/listener.py, over 127.0.0.1): refusals and failures a
client can cause, each in one line and at most once every ten seconds with a count, the
event loop's own reports held to the same bound, and what a client sent as printable text;
a fault of the server's own drops one connection only. Every socket and server a test makes
is closed when it ends, failed or not."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import struct
import time

from collector.admission import Limits
from collector.http11 import Heads, Request, Response
from collector.listener import RefusalLog, Seldom
from tests.listening import exchange, hello, listening
from tests.net import request, wait_until


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
