"""The listener's bounds (collector/listener.py, over 127.0.0.1): the requests answered at
once, the checks and views each in a worker of its own, the connections held (the
longest waiting evicted), below the open files' limit, and a flood of idle connections on a
real `serve` that leaves nothing behind. Every socket, server and process a test makes is
closed when it ends, failed or not."""

from __future__ import annotations

import resource
import socket
import struct
import subprocess
import threading
import time

import psutil
import pytest

from collector.admission import MAX_ASIDE, Deferred, Limits
from collector.http11 import MAX_HEAD_BYTES, Request, Response
from collector.listener import Listener
from tests.listening import (
    closed_by_server,
    exchange,
    hello,
    listening,
    open_sockets,
    pipelined_behind_one_in_flight,
    raise_own_open_files_limit,
    read_answer,
)
from tests.needs import tool
from tests.net import free_port, request, start_serve, wait_until


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
