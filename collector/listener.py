"""The HTTP listener: HTTP/1.1 on one asyncio event loop, with every resource bounded.

What a client can hold, whatever it does:

- a connection costs a socket and a small object, never a thread: all connections are
  served by one event loop thread (`serve_forever`'s), plus one worker thread for the
  bcrypt checks of basic auth (`Listener.slow`) and one for answers made on request
  (`Listener.views`: the processes view), so that neither waits for the other;
- a request must arrive whole — TLS handshake, request line and headers — within
  `header_timeout` of the connection's opening (or of its first byte, on a kept-alive
  connection), however slowly it trickles in; a kept-alive connection waits at most
  `idle_timeout` for its next request; a response must be taken within `write_timeout`;
- at most `max_requests` requests are answered at once (node_exporter's
  `--web.max-requests`; 0: no bound but the connections'); one more is answered 503 at once;
  a basic auth check holds none of those places (as node_exporter's bound sits behind
  exporter-toolkit's checks), and at most as many checks wait at once (`Deferred`); nor
  does a view being made (`/processes`), at most `MAX_ASIDE` at once;
- at most `max_connections` connections are open: a new one closes the one that has
  waited longest for a request (a flood evicts itself, not a scraper mid-request);
- a request line and headers are at most `MAX_HEAD_BYTES`; a request with a body is
  refused (413), as is anything that is not GET or HEAD (405): `collector.http11` finds
  and parses the heads, this module does the I/O;
- the counts behind these bounds are kept by one `Admission`, which a connection asks
  before it answers;
- nothing a client sends raises out of a callback: a malformed request is answered 400
  and its connection closed; a TLS failure is logged at debug level.

No library does all of this for this server's needs (see docs/deploy.md, "What the
listener withstands"): the stdlib's threading server has no bound and no header
deadline; cheroot, waitress, aiohttp and uvicorn have no deadline for the request as a
whole; none can request a client certificate without verifying it (exporter-toolkit's
`RequestClientCert` and `RequireAnyClientCert`), which `tls.Session` adapts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable

from collector import tls as tlslib
from collector.admission import (
    PIPELINED_PER_TURN,
    REQUEST,
    Admission,
    Deferred,
    Limits,
    TurnedAway,
)
from collector.http11 import (
    MAX_HEAD_BYTES,
    Heads,
    Request,
    Response,
    plain,
    printable,
    read_request,
)

log = logging.getLogger(__name__)

Handler = Callable[[Request], "Response | Deferred"]


class RefusalLog:
    """One log line per refused client, at most one every `every` seconds; the lines held
    back are counted into the next one."""

    def __init__(self, every: float = 10.0, monotonic: Callable[[], float] = time.monotonic):
        self.every = every
        self.monotonic = monotonic
        self._next = 0.0
        self._held = 0
        self._lock = threading.Lock()

    def refused(self, client: str, reason: str) -> None:
        held = self.turn()
        if held is not None:
            more = f" (and {held} more refused since the last line)" if held else ""
            log.info("refused %s: %s%s", client, reason, more)

    def failed(self, what: str) -> None:
        """A failure of the server's own, at error level, as seldom."""
        held = self.turn()
        if held is not None:
            more = f" (and {held} more failures since the last line)" if held else ""
            log.error("%s%s", what, more)

    def turn(self) -> int | None:
        """The lines held back since the last, where this one may be written; else None."""
        now = self.monotonic()
        with self._lock:
            if now < self._next:
                self._held += 1
                return None
            held, self._held, self._next = self._held, 0, now + self.every
        return held


class Seldom(logging.Filter):
    """A logger's records, at most one every `every` seconds (a `RefusalLog`'s bound), the
    ones held back counted into the next: asyncio logs a line for each write to a
    connection reset under it, which a client pipelining thousands of requests and then
    resetting would turn into a flood."""

    def __init__(self, every: float = 10.0, monotonic: Callable[[], float] = time.monotonic):
        super().__init__()
        self.bound = RefusalLog(every, monotonic)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.bound.turn()
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} (and {held} more held back since the last line)"
        return True


def bound_asyncio_logs() -> None:
    """Hold asyncio's own logger to the refusal log's bound, once per process."""
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, Seldom) for f in logger.filters):
        logger.addFilter(Seldom())


class _Connection(asyncio.Protocol):
    """One client connection: bytes in, one request at a time, bytes out."""

    def __init__(self, listener: Listener):
        self.listener = listener
        self.admission = listener.admission
        self.loop = listener.loop
        self.transport: asyncio.Transport | None = None
        self.tls: tlslib.Session | None = None
        self.terms: bytes | None = None  # the TLS terms it was made under (`Server.terms`)
        self.buffer = Heads()
        self.client = "?"
        self.busy = False  # a request is being answered
        self.reading = False  # `_next_request` is taking the buffered requests
        self.closing = False
        self.eof = False  # the client sent its last byte
        self.paused = False  # reading paused: more than a head's size is buffered
        self.yielded = False  # its turn given up: the rest of its pipeline is answered next
        self.timer: asyncio.TimerHandle | None = None
        self.drained: asyncio.Future | None = None

    # -- asyncio callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if peer else "?"
        transport.set_write_buffer_limits(high=256 * 1024)
        listener = self.listener
        evicted = self.admission.connected()
        if evicted is not None:
            evicted.abort("evicted: too many connections")
        tls = listener.tls()
        if tls is not None:
            self.tls = tls.session()
            self.terms = tls.terms
        self._wait(listener.limits.header_timeout, "no whole request in time")

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            if self.tls is not None:
                data = self.tls.receive(data)
                self._flush_tls()
            if data:
                if not self.buffer and not self.busy and self.timer_reason == "idle":
                    # the first byte of the next request: its head has a deadline of its own
                    self._wait(self.listener.limits.header_timeout, "no whole request in time")
                self.buffer.add(data)
                self._pace()
                self._next_request()
        except tlslib.Closed:
            self._flush_tls()
            self.close()
        except tlslib.Failed as error:
            self._flush_tls()
            log.debug("TLS with %s failed: %s", self.client, error)
            self.abort()
        except Exception as error:  # nothing a client sends may escape as a traceback
            log.debug("request from %s dropped: %r", self.client, error)
            self.abort()

    def eof_received(self) -> bool:
        self.eof = True
        if not self.busy and not self.yielded:
            self.close()
        return True  # keep the half-open socket until the response in flight is sent

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._cancel_timer()
        self.admission.disconnected(self)
        self.listener.connections.discard(self)
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(False)

    def pause_writing(self) -> None:
        if self.drained is None or self.drained.done():
            self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(True)

    # -- requests -------------------------------------------------------------------------

    def _next_request(self) -> None:
        """Answer the requests buffered, one at a time, while they are answered at once
        (an answer written from within this loop returns to it: no recursion), at most
        PIPELINED_PER_TURN before the other connections' callbacks run."""
        if self.reading or self.yielded:
            return
        self.reading = True
        try:
            for _ in range(PIPELINED_PER_TURN):
                if self.busy or self._closing():
                    return
                request = self._take_request()
                if request is None:
                    return
                self._start(*request)
            if self.buffer and not self.busy and not self._closing():
                self.yielded = True
                self.loop.call_soon(self._next_turn)
        finally:
            self.reading = False
            self._pace()

    def _next_turn(self) -> None:
        self.yielded = False
        try:
            self._next_request()
        except Exception as error:  # as in data_received: nothing escapes a callback
            log.debug("request from %s dropped: %r", self.client, error)
            self.abort()
            return
        if self.eof and not self.busy and not self.yielded:
            self.close()

    def _pace(self) -> None:
        """Read while at most one head's size waits in the buffer: a client's pipeline
        waits in its socket, not in the server's memory."""
        if self.transport is None or self._closing():
            return
        over = len(self.buffer) > MAX_HEAD_BYTES
        if over and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        elif not over and self.paused:
            self.paused = False
            self.transport.resume_reading()

    def _closing(self) -> bool:
        """Whether nothing more may be written: closed by either side (asyncio marks a
        transport closing as soon as a write fails, before `connection_lost`)."""
        return self.closing or (self.transport is not None and self.transport.is_closing())

    def _take_request(self) -> tuple[Request, bool] | None:
        """The next whole request of the buffer, and whether the connection closes after
        it; None when there is none yet (or it was refused, and the connection closed)."""
        head = self.buffer.take()
        if head is None:
            return None
        certified = self.tls is not None and self.tls.verified
        parsed = head if isinstance(head, Response) else read_request(head, self.client, certified)
        if isinstance(parsed, Response):
            self._refuse(parsed)
            return None
        return parsed

    def _start(self, request: Request, close: bool) -> None:
        if self.stale():
            # made under TLS terms since changed: closed unanswered, as an idle one is; the
            # client asks again on a connection made under the terms in force
            self.abort("made under TLS terms since changed")
            return
        self.admission.stops_waiting(self)
        self._cancel_timer()
        self.busy = True
        try:
            answer = self.listener.handler(request)
        except Exception as error:
            answer = _failed(request, error, self.listener.failures)
        self._answer(request, close, answer)

    def _answer(self, request: Request, close: bool, answer: Response | Deferred) -> None:
        """`answer` in its place (`Admission.enter`), or the client turned away: written at
        once, or made in a worker thread first. A 401 takes no place: it is written and its
        connection closed, so that clients without credentials cannot hold the places of
        scrapes by not reading their answers."""
        if isinstance(answer, Response) and answer.status == 401:
            self.busy = False
            self.listener.refusals.refused(
                self.client, f"{request.method} {printable(request.path)}: 401"
            )
            self._send(answer, send_body=request.method == "GET", close=True)
            return
        place = self.admission.enter(answer)
        if isinstance(place, TurnedAway):
            self._turn_away(request, place)
        elif isinstance(answer, Deferred):
            self.loop.create_task(self._made(request, close, answer, place))
        elif self._respond(request, close, answer):
            self._finish(close)

    def _turn_away(self, request: Request, turned: TurnedAway) -> None:
        self.busy = False
        self.listener.refusals.refused(self.client, turned.reason)
        # and close: nothing is read from a client turned away
        self._send(plain(503, turned.text), send_body=request.method == "GET", close=True)

    async def _made(self, request: Request, close: bool, deferred: Deferred, place: str):
        """A deferred answer made in its worker thread (a gate in the checks' thread, any
        other in the views'), then written; a gate's or a view's place is left once it is
        made, and what it answered takes the next (a gate passed may answer with a view)."""
        listener = self.listener
        executor = listener.slow if deferred.gate else listener.views
        try:
            answer = await self.loop.run_in_executor(executor, deferred.work)
        except Exception as error:
            answer = _failed(request, error, listener.failures)
        finally:
            if place != REQUEST:
                self.admission.leave(place)
        if place == REQUEST:
            # only a gate's answer is another `Deferred` (a view), and a gate holds no place
            assert isinstance(answer, Response)
            if self._respond(request, close, answer):
                self._finish(close)
        elif self.closing:
            self.busy = False
        else:
            self._answer(request, close, answer)

    def _respond(self, request: Request, close: bool, answer: Response) -> bool:
        """Write the answer; True if it is taken already (else `_finish` follows when it is)."""
        listener = self.listener
        if self._closing():
            self._done()
            return False
        head = answer.head(close)
        if request.method == "HEAD" or not answer.body:
            self._write(head)
        elif len(answer.body) < 65536:
            self._write(head + answer.body)  # one write, one segment
        else:
            self._write(head)
            self._write(answer.body)
        # The request holds its place among --web.max-requests until its response is taken
        # (or the write deadline passes): a client that does not read cannot make the
        # server buffer more than max_requests responses.
        if self.drained is not None and not self.drained.done():
            self.timer = self.loop.call_later(
                listener.limits.write_timeout, self._expired, "response not taken in time"
            )
            self.loop.create_task(self._drain(close))
            return False
        return True

    async def _drain(self, close: bool) -> None:
        assert self.drained is not None
        if await self.drained:
            self._cancel_timer()
            self._finish(close)
        else:
            self._done()

    def _done(self) -> None:
        self.admission.leave(REQUEST)
        self.busy = False

    def _finish(self, close: bool) -> None:
        """The response is taken: wait for the next request, or close."""
        self._done()
        if self.closing:
            return
        if close or (self.eof and not self.buffer) or self.stale():
            self.close()
            return
        self._wait(self.listener.limits.idle_timeout, "idle")
        self._pace()
        if self.buffer:
            self._wait(self.listener.limits.header_timeout, "no whole request in time")
            self._next_request()

    def _send(self, response: Response, send_body: bool, close: bool) -> None:
        self._write(response.head(close))
        if send_body:
            self._write(response.body)
        if close:
            self.close()

    def _refuse(self, response: Response) -> None:
        self.listener.refusals.refused(self.client, f"{response.status}: {response.reason}")
        self._send(response, send_body=True, close=True)

    # -- bytes out, timers, closing ----------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.transport is None or self._closing() or not data:
            return
        if self.tls is not None:
            data = self.tls.send(data)
        self.transport.write(data)

    def _flush_tls(self) -> None:
        if self.tls is not None and self.transport is not None and not self.closing:
            pending = self.tls.pending()
            if pending:
                self.transport.write(pending)

    timer_reason = ""

    def _wait(self, seconds: float, reason: str) -> None:
        """Close the connection unless something else happens within `seconds`."""
        self._cancel_timer()
        self.timer_reason = reason
        self.timer = self.loop.call_later(seconds, self._expired, reason)
        if not self.busy:
            self.admission.waits(self)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_reason = ""

    def stale(self) -> bool:
        """Whether it was made under TLS terms other than those in force (another CA,
        client certificate mode or version): then closed once idle."""
        if self.terms is None:
            return False
        tls = self.listener.tls()
        return tls is None or tls.terms != self.terms

    def _expired(self, reason: str) -> None:
        self.timer = None
        if reason != "idle":
            log.debug("closing the connection of %s: %s", self.client, reason)
        self.abort()

    def close(self) -> None:
        """Close once what is written is sent: within the write deadline, or abort."""
        if self.transport is not None and not self.closing:
            if self.tls is not None:
                self.transport.write(self.tls.close())
            self.closing = True
            self._cancel_timer()
            self.admission.stops_waiting(self)
            if self.transport.get_write_buffer_size():
                self.timer = self.loop.call_later(
                    self.listener.limits.write_timeout, self._expired, "response not taken"
                )
            self.transport.close()

    def abort(self, reason: str = "") -> None:
        if reason:
            log.debug("closing the connection of %s: %s", self.client, reason)
        if self.transport is not None:
            self.closing = True
            self.transport.abort()


def _failed(request: Request, error: Exception, failures: RefusalLog) -> Response:
    """A handler's failure: logged as a refusal is, one line every 10 s at most, so that
    a client who found a way to make one cannot fill the log."""
    failures.failed(f"answering {request.method} {printable(request.path, 64)} failed: {error!r}")
    return plain(500, "internal error")


def _no_tls() -> None:
    return None


class Listener:
    """Serves `handler` on a bound socket, from `serve_forever`'s thread, until `shutdown`;
    `tls` gives the TLS a new connection is served with (or None: plain HTTP), asked at
    each connection, so that a reloaded web configuration's certificate serves the next."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        tls: Callable[[], tlslib.Server | None] = _no_tls,
        limits: Limits | None = None,
    ):
        self.socket = sock
        self.handler = handler
        self.tls = tls
        self.limits = limits or Limits()
        # Below the open files limit, so that the eviction comes before accept() fails.
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            self.limits.max_connections = min(self.limits.max_connections, max(16, soft - 64))
        self.admission: Admission[_Connection] = Admission(self.limits)
        self.connections: set[_Connection] = set()
        self.refusals = RefusalLog()
        self.failures = RefusalLog()
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet)
        bound_asyncio_logs()
        # One worker: bcrypt checks run one at a time, as exporter-toolkit runs them, so
        # that wrong passwords cost one CPU at most.
        self.slow = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="auth")
        # One worker for answers made on request: a second one would only share the GIL.
        self.views = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="views")
        self._stopped = threading.Event()
        self._stopped.set()
        self._server: asyncio.base_events.Server | None = None
        # A stop asked before serving began, or while the server is being made, takes
        # effect once it is made: stopping the loop sooner would cut its making short.
        self._asked = threading.Event()
        self._serving = threading.Event()

    @property
    def server_address(self) -> tuple:
        return self.socket.getsockname()

    def _protocol(self) -> _Connection:
        connection = _Connection(self)
        self.connections.add(connection)
        return connection

    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            if self._asked.is_set():
                return  # stopped before it began
            asyncio.set_event_loop(self.loop)
            self._server = self.loop.run_until_complete(
                self.loop.create_server(
                    self._protocol, sock=self.socket, backlog=1024, start_serving=True
                )
            )
            self._serving.set()
            self.loop.run_forever()
            self._server.close()
            for connection in list(self.connections):
                connection.abort()
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(asyncio.sleep(0))
        finally:
            self._serving.set()
            self._stopped.set()

    def terms_changed(self) -> None:
        """The TLS terms changed (from any thread): the connections made under others are
        closed now where idle, else once their answer is taken."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to close
            self.loop.call_soon_threadsafe(self._close_stale)

    def _close_stale(self) -> None:
        for connection in list(self.connections):
            if not connection.busy and connection.stale():
                connection.close()

    def shutdown(self) -> None:
        """Stop serving (from another thread) and wait until `serve_forever` returns; one
        not begun yet returns as soon as it begins. Serving does not start again."""
        self._asked.set()
        if not self._stopped.is_set():
            self._serving.wait()
            if self._server is not None:
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._stopped.wait()

    def server_close(self) -> None:
        self.slow.shutdown(wait=True, cancel_futures=True)
        self.views.shutdown(wait=True, cancel_futures=True)
        if not self.loop.is_closed():
            self.loop.close()
        self.socket.close()


def _quiet(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """What asyncio would print with a traceback (an accept that hit the descriptor
    limit, a transport error): one line, at debug level, unless it is the server's own."""
    error = context.get("exception")
    if isinstance(error, OSError | asyncio.CancelledError) or error is None:
        log.debug("listener: %s %s", context.get("message"), error or "")
    else:
        log.error("listener: %s: %r", context.get("message"), error)
