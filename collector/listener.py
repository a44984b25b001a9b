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
  refused (413), as is anything that is not GET or HEAD (405);
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
import collections
import concurrent.futures
import logging
import re
import resource
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from collector import tls as tlslib

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""A request line and headers longer than this are refused (431)."""

HEADER_TIMEOUT = 10.0
IDLE_TIMEOUT = 120.0
WRITE_TIMEOUT = 30.0
MAX_REQUESTS = 40
MAX_CONNECTIONS = 4096
MAX_GATES = 64
"""Gates (`Deferred`) waiting at once with `--web.max-requests 0`."""
MAX_ASIDE = 4
"""Answers made aside (`Deferred(aside=True)`: views) waiting or being made at once."""

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names; a repeated header's values joined by ", "
    client: str

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    def head(self, close: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            # a browser never reads an answer as another type than it says (an error's
            # text naming what the client sent as HTML, say)
            "X-Content-Type-Options: nosniff",
        ]
        lines.extend(f"{name}: {value}" for name, value in self.headers)
        if close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Deferred:
    """A handler's answer that must not run on the event loop: `work` runs in a worker
    thread of the listener's and returns the response — a gate (a bcrypt check) in
    `Listener.slow`, any other (a view made on request) in `Listener.views`.

    A `gate` (basic auth) holds no place among `max_requests` while it waits and runs, as
    node_exporter's bound sits behind exporter-toolkit's checks: clients without the
    password cannot turn scrapers away. Its answer takes a place when it is written. At
    most `max_requests` gates wait at once (or `MAX_GATES`, without a bound); one more is
    answered 503 at once.

    An answer made `aside` (a view, in `Listener.views`) likewise holds no place while it
    waits and is made, so that a burst of views cannot turn scrapers and probes away; at
    most `MAX_ASIDE` wait or are made at once, one more is answered 503 at once. Any other
    `Deferred` holds its place throughout."""

    __slots__ = ("aside", "gate", "work")

    def __init__(self, work: Callable[[], Response], gate: bool = False, aside: bool = False):
        self.work = work
        self.gate = gate
        self.aside = aside


Handler = Callable[[Request], "Response | Deferred"]


def plain(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode())


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
        held = self._turn()
        if held is not None:
            more = f" (and {held} more refused since the last line)" if held else ""
            log.info("refused %s: %s%s", client, reason, more)

    def failed(self, what: str) -> None:
        """A failure of the server's own, at error level, as seldom."""
        held = self._turn()
        if held is not None:
            more = f" (and {held} more failures since the last line)" if held else ""
            log.error("%s%s", what, more)

    def _turn(self) -> int | None:
        """The lines held back since the last, where this one may be written; else None."""
        now = self.monotonic()
        with self._lock:
            if now < self._next:
                self._held += 1
                return None
            held, self._held, self._next = self._held, 0, now + self.every
        return held


@dataclass
class Limits:
    max_requests: int = MAX_REQUESTS
    max_connections: int = MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    write_timeout: float = WRITE_TIMEOUT


@dataclass
class _Counts:
    in_flight: int = 0
    gates: int = 0  # gates (`Deferred`) waiting or running
    aside: int = 0  # answers made aside (views) waiting or being made
    connections: int = 0
    waiting: collections.OrderedDict = field(default_factory=collections.OrderedDict)


class _Connection(asyncio.Protocol):
    """One client connection: bytes in, one request at a time, bytes out."""

    def __init__(self, listener: Listener):
        self.listener = listener
        self.loop = listener.loop
        self.transport: asyncio.Transport | None = None
        self.tls: tlslib.Session | None = None
        self.buffer = bytearray()
        self.scanned = 0  # the buffer holds no head's end before this offset
        self.client = "?"
        self.busy = False  # a request is being answered
        self.closing = False
        self.eof = False  # the client sent its last byte
        self.paused = False  # reading paused: a request is answered and more is buffered
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
        counts = listener.counts
        counts.connections += 1
        if counts.connections > listener.limits.max_connections and counts.waiting:
            oldest, _ = counts.waiting.popitem(last=False)
            oldest.abort("evicted: too many connections")
        tls = listener.tls_server()
        if tls is not None:
            self.tls = tls.session()
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
                self.buffer += data
                if self.busy and len(self.buffer) > MAX_HEAD_BYTES and not self.paused:
                    self.paused = True  # pipelined requests wait, up to one head's size
                    self.transport.pause_reading()
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
        if not self.busy:
            self.close()
        return True  # keep the half-open socket until the response in flight is sent

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._cancel_timer()
        counts = self.listener.counts
        counts.connections -= 1
        counts.waiting.pop(self, None)
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
        """Answer the requests buffered, one at a time, while they are answered at once."""
        while not self.busy and not self.closing:
            request = self._take_request()
            if request is None:
                return
            self._start(*request)

    def _take_request(self) -> tuple[Request, bool] | None:
        """The next whole request of the buffer, and whether the connection closes after
        it; None when there is none yet (or it was refused, and the connection closed)."""
        if self.buffer[:1] in (b"\r", b"\n"):  # empty lines before a request (RFC 9112 §2.2)
            del self.buffer[: len(self.buffer) - len(self.buffer.lstrip(b"\r\n"))]
            self.scanned = 0
        end = self.buffer.find(b"\r\n\r\n", self.scanned)
        if _bare_lf(self.buffer, self.scanned, len(self.buffer) if end < 0 else end):
            # a line ended by LF alone: refused at once, not left to the head's deadline
            self._refuse(400, "a line of the request head ends without CR")
            return None
        if end < 0:
            # a head trickled in a byte at a time is scanned once, not once per byte
            self.scanned = max(0, len(self.buffer) - 3)
            if len(self.buffer) > MAX_HEAD_BYTES:
                self._refuse(431, "request head too large")
            return None
        if end > MAX_HEAD_BYTES:
            self._refuse(431, "request head too large")
            return None
        head = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        self.scanned = 0
        parsed = _parse_head(head, self.client)
        if isinstance(parsed, Response):
            self._refuse(parsed.status, parsed.body.decode().strip(), parsed)
            return None
        request, version = parsed
        problem = _refused_shape(request)
        if problem is not None:
            self._refuse(problem.status, problem.body.decode().strip(), problem)
            return None
        connection = request.headers.get("connection", "").lower()
        # a list of tokens (RFC 9110 §7.6.1): `close` among them, not inside one
        return request, version == "HTTP/1.0" or "close" in map(str.strip, connection.split(","))

    def _start(self, request: Request, close: bool) -> None:
        listener = self.listener
        listener.counts.waiting.pop(self, None)
        self._cancel_timer()
        self.busy = True
        try:
            answer = listener.handler(request)
        except Exception as error:
            answer = _failed(request, error, self.listener.failures)
        self._dispatch(request, close, answer, proceed=False)

    def _dispatch(
        self, request: Request, close: bool, answer: Response | Deferred, proceed: bool
    ) -> None:
        """A gate or an answer made aside waits outside --web.max-requests, within its own
        bound; anything else is admitted."""
        if not (isinstance(answer, Deferred) and (answer.gate or answer.aside)):
            self._admit(request, close, answer, proceed)
            return
        counts = self.listener.counts
        if answer.gate:
            if counts.gates >= (self.listener.limits.max_requests or MAX_GATES):
                self._turn_away(request, "503: too many checks waiting")
                return
            counts.gates += 1
        else:
            if counts.aside >= MAX_ASIDE:
                self._turn_away(request, "503: too many views waiting", views=True)
                return
            counts.aside += 1
        self.loop.create_task(self._gated(request, close, answer))

    def _admit(self, request: Request, close: bool, answer: Response | Deferred, proceed: bool):
        """Answer within --web.max-requests, or 503."""
        listener = self.listener
        if 0 < listener.limits.max_requests <= listener.counts.in_flight:
            self._turn_away(request, "503: --web.max-requests reached")
            return
        listener.counts.in_flight += 1
        if isinstance(answer, Deferred):
            self.loop.create_task(self._deferred(request, close, answer))
        elif self._respond(request, close, answer):
            self._finish(close, proceed=proceed)

    def _turn_away(self, request: Request, reason: str, views: bool = False) -> None:
        listener = self.listener
        self.busy = False
        listener.refusals.refused(self.client, reason)
        text = (
            f"too many views at once ({MAX_ASIDE}); try again later"
            if views
            else f"too many requests at once (--web.max-requests "
            f"{listener.limits.max_requests}); try again later"
        )
        self._send(  # and close: nothing is read from a client turned away
            plain(503, text), send_body=request.method == "GET", close=True
        )

    async def _gated(self, request: Request, close: bool, deferred: Deferred) -> None:
        """A gate in the checks' thread, or an answer made aside in the views' thread; then
        what it answered, dispatched (a gate passed may answer with a view)."""
        listener = self.listener
        executor = listener.slow if deferred.gate else listener.views
        try:
            answer = await self.loop.run_in_executor(executor, deferred.work)
        except Exception as error:
            answer = _failed(request, error, self.listener.failures)
        finally:
            if deferred.gate:
                listener.counts.gates -= 1
            else:
                listener.counts.aside -= 1
        if self.closing:
            self.busy = False
            return
        self._dispatch(request, close, answer, proceed=True)

    async def _deferred(self, request: Request, close: bool, deferred: Deferred) -> None:
        try:
            answer = await self.loop.run_in_executor(self.listener.views, deferred.work)
        except Exception as error:
            answer = _failed(request, error, self.listener.failures)
        if self._respond(request, close, answer):
            self._finish(close, proceed=True)

    def _respond(self, request: Request, close: bool, answer: Response) -> bool:
        """Write the answer; True if it is taken already (else `_finish` follows when it is)."""
        listener = self.listener
        if self.closing:
            self._done()
            return False
        if answer.status == 401:
            listener.refusals.refused(self.client, f"{request.method} {request.path}: 401")
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
            self._finish(close, proceed=True)
        else:
            self._done()

    def _done(self) -> None:
        self.listener.counts.in_flight -= 1
        self.busy = False

    def _finish(self, close: bool, proceed: bool) -> None:
        """The response is taken: wait for the next request, or close."""
        self._done()
        if self.closing:
            return
        if close or (self.eof and not self.buffer):
            self.close()
            return
        self._wait(self.listener.limits.idle_timeout, "idle")
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        if self.buffer:
            self._wait(self.listener.limits.header_timeout, "no whole request in time")
            if proceed:
                self._next_request()

    def _send(self, response: Response, send_body: bool, close: bool) -> None:
        self._write(response.head(close))
        if send_body:
            self._write(response.body)
        if close:
            self.close()

    def _refuse(self, status: int, reason: str, response: Response | None = None) -> None:
        self.listener.refusals.refused(self.client, f"{status}: {reason}")
        self._send(response or plain(status, reason), send_body=True, close=True)

    # -- bytes out, timers, closing ----------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.closing or not data:
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
            waiting = self.listener.counts.waiting
            waiting.pop(self, None)
            waiting[self] = None

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_reason = ""

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
            self.listener.counts.waiting.pop(self, None)
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


def _bare_lf(buffer: bytearray, start: int, end: int) -> bool:
    """Whether an LF not preceded by CR lies in buffer[start:end]."""
    at = buffer.find(b"\n", start, end)
    while at >= 0:
        if at == 0 or buffer[at - 1] != 0x0D:
            return True
        at = buffer.find(b"\n", at + 1, end)
    return False


def _failed(request: Request, error: Exception, failures: RefusalLog) -> Response:
    """A handler's failure: logged as a refusal is, one line every 10 s at most, so that
    a client who found a way to make one cannot fill the log."""
    failures.failed(f"answering {request.method} {request.path[:64]!r} failed: {error!r}")
    return plain(500, "internal error")


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header field's name (RFC 9110 §5.1, §5.6.2)."""
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")
"""RFC 9110 §12.4.2."""


def accepted(header: str | None, token: str, wildcard: str | None = "*") -> bool:
    """Whether a list of tokens with weights (Accept-Encoding, Accept; RFC 9110 §12.4.2)
    accepts `token` (lower case): listed with a weight above 0 (`gzip;q=0` refuses it), or
    not listed while `wildcard` is, with a weight above 0. A malformed weight is 0."""
    if not header:
        return False
    star = False
    for part in header.split(","):
        name, *params = part.split(";")
        name = name.strip().lower()
        weight = True
        for param in params:
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                value = value.strip()
                weight = bool(_QVALUE.fullmatch(value)) and float(value) > 0
        if name == token:
            return weight
        if wildcard is not None and name == wildcard:
            star = weight
    return star


def _parse_head(head: bytes, client: str) -> tuple[Request, str] | Response:
    try:
        text = head.decode("latin-1")
        line, *fields = text.split("\r\n")
        method, target, version = line.split(" ")
    except ValueError:
        return plain(400, "malformed request line")
    if any(c in text.replace("\r\n", "") for c in "\r\n\x00"):
        # a bare CR or LF a proxy in front may read as a line's end (RFC 9112 §2.2), a NUL
        return plain(400, "bare CR, LF or NUL in the request head")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if version.startswith("HTTP/"):
            return plain(505, "HTTP/1.1 or HTTP/1.0 only")
        return plain(400, "malformed request line")
    if not target.startswith("/") or not method.isalpha():
        return plain(400, "malformed request line")
    headers: dict[str, str] = {}
    for entry in fields:
        name, colon, value = entry.partition(":")
        # a name is a token: no space before the colon (RFC 9112 §5.1), no control
        # characters, no separators; a line folded onto the last (obs-fold) is none
        if not colon or not _TOKEN.fullmatch(name):
            return plain(400, "malformed header")
        key = name.lower()
        value = value.strip(" \t")
        if key in headers:
            if key in ("authorization", "content-length", "host"):
                return plain(400, f"{name} given twice")
            headers[key] += ", " + value
        else:
            headers[key] = value
    if version == "HTTP/1.1" and "host" not in headers:
        return plain(400, "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)")
    return Request(method, target, headers, client), version


def _refused_shape(request: Request) -> Response | None:
    """What this server never answers: a body, a method other than GET and HEAD."""
    if "transfer-encoding" in request.headers or request.headers.get(
        "content-length", "0"
    ).strip() not in ("0", ""):
        return plain(413, "a request body is not accepted")
    if request.method not in ("GET", "HEAD"):
        return Response(405, b"GET or HEAD only\n", headers=(("Allow", "GET, HEAD"),))
    return None


class Listener:
    """Serves `handler` on a bound socket, from `serve_forever`'s thread, until `shutdown`."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        tls: tlslib.Server | None = None,
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
        self.counts = _Counts()
        self.connections: set[_Connection] = set()
        self.refusals = RefusalLog()
        self.failures = RefusalLog()
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet)
        # One worker: bcrypt checks run one at a time, as exporter-toolkit runs them, so
        # that wrong passwords cost one CPU at most.
        self.slow = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="auth")
        # One worker for answers made on request: a second one would only share the GIL.
        self.views = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="views")
        self._stopped = threading.Event()
        self._stopped.set()
        self._server: asyncio.base_events.Server | None = None

    @property
    def server_address(self) -> tuple:
        return self.socket.getsockname()

    def tls_server(self) -> tlslib.Server | None:
        """The TLS a new connection is served with (a subclass may change it over time)."""
        return self.tls

    def _protocol(self) -> _Connection:
        connection = _Connection(self)
        self.connections.add(connection)
        return connection

    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            asyncio.set_event_loop(self.loop)
            self._server = self.loop.run_until_complete(
                self.loop.create_server(
                    self._protocol, sock=self.socket, backlog=1024, start_serving=True
                )
            )
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
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving (from another thread) and wait until `serve_forever` returns."""
        if not self._stopped.is_set():
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
