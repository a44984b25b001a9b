"""The listener's deadlines (collector/listener.py, over 127.0.0.1): one for a request's head
however slowly it comes, one for an answer not taken, and what a connection cut for either
is logged as. Every socket and server a test makes is closed when it ends, failed or not."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from collector.admission import Deferred, Limits
from collector.http11 import Request, Response
from tests.listening import closed_by_server, hello, listening, read_answer, until_closed
from tests.net import wait_until


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
