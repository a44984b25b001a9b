"""The listener's start and stop (collector/listener.py, over 127.0.0.1): a stop asked at any
moment takes effect, a shutdown waits for nothing, and the server's close waits for the
work in flight and leaves no descriptor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time

import pytest

from collector.admission import Deferred
from collector.http11 import Request, Response
from collector.listener import Listener
from tests.listening import closed_by_server, hello, listening
from tests.net import wait_until


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


@pytest.mark.parametrize(("check", "view"), [(0.6, 0.1), (0.1, 0.6)])
def test_server_close_waits_for_the_work_in_flight_and_leaves_no_descriptor(check, view):
    """`server_close` returns once the checks and views being made have ended (nothing
    runs past it, whichever ends last), and with the event loop's descriptors closed."""
    before = len(os.listdir("/proc/self/fd"))
    ended: list[str] = []
    started = {"/gate": threading.Event(), "/aside": threading.Event()}
    go = threading.Event()

    def handler(request: Request) -> Deferred:
        def work() -> Response:
            # Both are held in flight until the test has seen them so: a check shorter than
            # the test's polling must not end before it is seen.
            started[request.path].set()
            go.wait(10)
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
            for path, event in started.items():
                assert event.wait(10), f"{path} not in flight within 10s"
            assert (listener.admission.gates, listener.admission.aside) == (1, 1)
            go.set()
        assert sorted(ended) == ["/aside", "/gate"]
        assert listener.loop.is_closed()
    assert len(os.listdir("/proc/self/fd")) == before
