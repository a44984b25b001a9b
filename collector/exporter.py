"""The HTTP app: the routes (`/metrics`, `/processes`, `/healthz`, the landing page), their
rate limit and view cache, and the listening address, over a `Listener` it holds.

It serves the snapshots a `PassLoop` publishes (collector/passloop.py): a scrape only
reads the current one, it never waits for a pass and never advances the cache.
"""

from __future__ import annotations

import errno
import html
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client import generate_latest as client_text
from prometheus_client.openmetrics.exposition import generate_latest as client_openmetrics

from collector import __version__
from collector.admission import Deferred, Limits
from collector.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    gzip_member,
)
from collector.http11 import Request, Response, accepted, plain
from collector.listener import Listener
from collector.passloop import PassLoop
from collector.processes import STORAGE_FIELDS, Query, QueryError
from collector.tls import Server as TLSServer
from collector.webconfig import WebConfig, WebConfigFile

log = logging.getLogger(__name__)


class LiveMetrics:
    """The collector's own `process_*` and `python_*` metrics, read at scrape time and
    kept for up to `ttl` seconds, so that a burst of scrapes reads them once."""

    def __init__(self, ttl: float = 1.0, monotonic: Callable[[], float] = time.monotonic):
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.ttl = ttl
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._pages: dict[tuple[bool, bool], tuple[float, bytes]] = {}

    def page(self, openmetrics: bool, gzipped: bool) -> bytes:
        key = (openmetrics, gzipped)
        now = self.monotonic()
        with self._lock:
            cached = self._pages.get(key)
            if cached is not None and now - cached[0] < self.ttl:
                return cached[1]
            body = (client_openmetrics if openmetrics else client_text)(self.registry)
            if gzipped:
                body = gzip_member(body)
            self._pages[key] = (now, body)
            return body


def wants_openmetrics(accept: str | None) -> bool:
    """Content negotiation as Prometheus does it: OpenMetrics only when asked for (listed,
    with a weight above 0; `*/*` is the text format)."""
    return accepted(accept, "application/openmetrics-text", wildcard=None)


LANDING = """<!DOCTYPE html>
<html><head><title>procdelta</title></head>
<body><h1>procdelta</h1>
<p>Per-pod process counters for Prometheus, with deltas taken on the node. Version {version}.</p>
<ul>
<li><a href="{path}">{path}</a> — metrics</li>
<li><a href="/healthz">/healthz</a> — health</li>{processes}
</ul>
</body></html>
"""


UNAUTHORIZED = Response(
    401, b"unauthorized\n", headers=(("WWW-Authenticate", 'Basic realm="procdelta"'),)
)


PROCESSES_LINK = """
<li><a href="/processes">/processes</a> — which processes wait (JSON; \
<code>?namespace=&amp;pod=&amp;sort=&amp;limit=</code>)</li>"""


VIEWS_PER_SECOND = 20
"""`/processes` answers a second at most (a burst of as many, then 503): a view is for a
person (`top` asks once an interval), and a flood of them, even of answers made already,
would take from the scrapes the event loop and the CPU the node gives `serve`."""


class Budget:
    """A token bucket: `rate` takes a second, as many at once at most."""

    def __init__(self, rate: float, monotonic: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.monotonic = monotonic
        self._tokens = rate
        self._at = monotonic()

    def take(self) -> bool:
        now = self.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class ViewAnswers:
    """The answers to the last few queries of `/processes` for the last pass: a view is
    made once a pass for each query, however many ask it (a flood of one query costs its
    making once a pass, then a write each, as a scrape does), and a new pass drops them.
    At most `count` answers and `size` bytes are held."""

    def __init__(self, count: int = 8, size: int = 16 << 20):
        self.count = count
        self.size = size
        self._answers: dict[tuple, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple) -> bytes | None:
        with self._lock:
            return self._answers.get(key)

    def put(self, key: tuple, body: bytes) -> None:
        with self._lock:
            if any(k[0] != key[0] for k in self._answers):
                self._answers.clear()  # another pass: every answer is stale
            self._answers[key] = body
            while len(self._answers) > self.count or (
                sum(map(len, self._answers.values())) > self.size and len(self._answers) > 1
            ):
                del self._answers[next(iter(self._answers))]  # the oldest first


def json_by_rows(document: Mapping[str, object]) -> bytes:
    """`json.dumps(document) + "\\n"`, the same bytes, made a row of its lists at a time.
    The C encoder holds the interpreter's lock for a whole call: one call for a node's
    every process held a scrape back for tens of milliseconds, where a row's call is
    microseconds and the event loop gets the lock between two."""
    parts = []
    for key, value in document.items():
        if isinstance(value, list):
            text = "[" + ", ".join([json.dumps(item) for item in value]) + "]"
        else:
            text = json.dumps(value)
        parts.append(f"{json.dumps(key)}: {text}")
    return ("{" + ", ".join(parts) + "}\n").encode()


STORAGE_REFUSED = (
    "forbidden: sort={sort}: a process's storage bytes (/proc/<pid>/io, its owner's alone) "
    "are served only to clients the web configuration authenticates (basic auth, or "
    "RequireAndVerifyClientCert), or to all with --web.processes.storage-bytes"
)


class MetricsServer:
    """Serves the current snapshot on a `collector.listener.Listener` (bounded HTTP/1.1):
    `telemetry_path`, `/healthz`, `/processes` (unless `processes` is off) and the
    landing page, every one under basic auth. Its routes are its own; the listener, its
    `listener`, holds the connections and their bounds."""

    def __init__(
        self,
        address: tuple,
        family: int,
        passes: PassLoop,
        telemetry_path: str,
        web: WebConfig | WebConfigFile | None = None,
        limits: Limits | None = None,
        processes: bool = True,
        cgroup_fields: bool = True,
        storage_bytes: bool = False,
    ):
        self.passes = passes
        self.telemetry_path = telemetry_path
        self.web = web or WebConfig()  # .current(): the configuration in force
        self.processes = processes  # /processes served (docs/reference.md §8)
        self.cgroup_fields = cgroup_fields  # the groups in its answer carry the §7 fields
        # each process's storage bytes to every client, not only to those the web
        # configuration authenticates (--web.processes.storage-bytes)
        self.storage_bytes = storage_bytes
        self.answers = ViewAnswers()
        self.views_budget = Budget(VIEWS_PER_SECOND)
        self.live = LiveMetrics()
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
            sock.listen(1024)  # the backlog: a burst of scrapers is not dropped
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.listener = Listener(sock, self.handle, self.tls, limits)
        if isinstance(self.web, WebConfigFile):
            self.web.on_swap(lambda old, new: self.listener.terms_changed())

    @property
    def server_address(self) -> tuple:
        return self.listener.server_address

    def serve_forever(self) -> None:
        self.listener.serve_forever()

    def shutdown(self) -> None:
        self.listener.shutdown()

    def server_close(self) -> None:
        self.listener.server_close()

    def tls(self) -> TLSServer | None:
        """The TLS of a new connection: the web configuration's in force."""
        return self.web.current().tls

    def handle(self, request: Request) -> Response | Deferred:
        web = self.web.current()
        header = request.headers.get("authorization")
        known = web.remembered(header)
        if known is None:  # a bcrypt check: in the worker thread, not on the event loop
            return Deferred(
                lambda: self._route(request, web) if web.authorized(header) else UNAUTHORIZED,
                gate=True,  # holds no --web.max-requests place while it waits
            )
        return self._route(request, web) if known else UNAUTHORIZED

    def _route(self, request: Request, web: WebConfig) -> Response | Deferred:
        path = request.path
        if path == self.telemetry_path:
            return self._metrics(request)
        if path == "/healthz":
            ok, reason = self.passes.healthy()
            return plain(200 if ok else 503, reason)
        if path == "/processes":
            # authenticated: by a password (checked before), or by a client certificate
            # this connection's handshake verified under the terms in force
            authenticated = bool(web.users) or request.certified
            return self._processes(request, self.storage_bytes or authenticated)
        if path == "/":
            page = LANDING.format(
                version=__version__,
                path=html.escape(self.telemetry_path),
                processes=PROCESSES_LINK if self.processes else "",
            )
            return Response(200, page.encode(), "text/html; charset=utf-8")
        return plain(404, "not found")

    def _processes(self, request: Request, storage_bytes: bool) -> Response | Deferred:
        """The last completed pass's processes (docs/reference.md §8), made on request in
        the listener's views thread: the event loop, and so every scrape of /metrics,
        never waits for it, and it waits for no pass. A client the web configuration does
        not authenticate gets no process's storage bytes, which `/proc` shows the
        process's owner alone (unless --web.processes.storage-bytes)."""
        if not self.processes:
            return plain(404, "not found: the processes view is off (--no-web.processes)")
        try:
            query = Query.parse(request.query)
        except QueryError as error:
            return plain(400, str(error))
        if not storage_bytes and query.sort in STORAGE_FIELDS:
            return plain(403, STORAGE_REFUSED.format(sort=query.sort))
        if not self.views_budget.take():
            self.listener.refusals.refused(request.client, "GET /processes: 503: views a second")
            return Response(
                503,
                f"too many views a second (at most {VIEWS_PER_SECOND}); try again later\n".encode(),
                headers=(("Retry-After", "1"),),
            )
        snapshot = self.passes.snapshot()
        view, cgroup_fields, answers = snapshot.view, self.cgroup_fields, self.answers
        key = (snapshot.passes, query, storage_bytes)
        body = answers.get(key)
        if body is not None:  # asked already of this pass: the same bytes
            return Response(200, body, "application/json")

        def answer() -> Response:
            body = answers.get(key)
            if body is None:
                body = json_by_rows(view.document(query, cgroup_fields, storage_bytes))
                answers.put(key, body)
            return Response(200, body, "application/json")

        return Deferred(answer, aside=True)  # no --web.max-requests place while it is made

    def _metrics(self, request: Request) -> Response:
        snapshot = self.passes.snapshot()
        openmetrics = wants_openmetrics(request.headers.get("accept"))
        gzip_ok = accepted(request.headers.get("accept-encoding"), "gzip")
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        # Concatenated gzip members are one valid gzip stream (RFC 1952 §2.2).
        body = snapshot.page.body(openmetrics, gzip_ok) + self.live.page(openmetrics, gzip_ok)
        headers = (("Content-Encoding", "gzip"),) if gzip_ok else ()
        return Response(200, body, content_type, headers)


class ListenAddressError(ValueError):
    """A `--web.listen-address` that is malformed, unresolvable or cannot be bound."""


class CannotBind(ListenAddressError):
    """A well-formed address the host refuses to bind (in use, not its own)."""


def parse_listen_address(address: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` (every interface)."""
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ListenAddressError(f"malformed address {address!r}: want [host]:port")
        port_text = rest[1:]
    else:
        host, colon, port_text = address.rpartition(":")
        if not colon or ":" in host:
            raise ListenAddressError(f"malformed address {address!r}: want host:port or :port")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ListenAddressError(f"malformed address {address!r}: bad port {port_text!r}")
    return host, int(port_text)


def make_server(
    address: str,
    loop: PassLoop,
    telemetry_path: str,
    web: WebConfig | WebConfigFile | None = None,
    limits: Limits | None = None,
    processes: bool = True,
    cgroup_fields: bool = True,
    storage_bytes: bool = False,
) -> MetricsServer:
    """Bind the HTTP server now, so that a bad address fails before anything starts."""
    host, port = parse_listen_address(address)
    candidates: list[tuple[socket.AddressFamily, tuple[str, int] | tuple[int, bytes]]]
    if host == "":
        candidates = [(socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))]
        if not socket.has_ipv6:
            candidates = candidates[1:]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            raise ListenAddressError(f"{address}: {error.strerror}") from None
        candidates = [(info[0], info[4][:2]) for info in infos]
    last_error: OSError | None = None
    for family, bind_to in candidates:
        try:
            return MetricsServer(
                bind_to,
                family,
                loop,
                telemetry_path,
                web,
                limits,
                processes,
                cgroup_fields,
                storage_bytes,
            )
        except OSError as error:
            last_error = error
            if error.errno != errno.EAFNOSUPPORT:  # no such family here: try the next one
                break
    reason = last_error.strerror if last_error else "cannot bind"
    raise CannotBind(f"{address}: {reason}")
