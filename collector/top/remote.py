"""`--from URL`: GETs of a running `serve`'s `/processes`, trusting the server with nothing:
no redirect followed, a deadline and a size cap on each answer, its shape checked
before it is drawn, its text shown only as printable characters."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import math
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from collector import __version__
from collector.output import printable
from collector.procfs import ProcFS
from collector.top.core import Selection, View
from collector.top.errors import BadValue, TopError
from collector.top.threads import check_same_node

REQUEST_TIMEOUT = 10.0  # seconds a GET of --from may take, from connecting to its last byte
MAX_ANSWER_BYTES = 16 << 20
"""The most of a server's answer --from reads: a node's every process and group is a few
MiB (~40,000 processes fit); more is no procdelta answer, and is not held in memory."""
MAX_ANSWER_VALUES = 1_500_000
"""The most JSON values (counted by their `{`, `[`, `,` and `:`) an answer may hold before it
is parsed: a process is 36, so ~40,000 fit; an answer of tiny values (`[{},{},…]`) would
cost 25 times its size to parse, this bounds it to a few times."""
MAX_COUNT = 2**64 - 1
"""The largest count drawn: the kernel's counters are 64-bit."""


@dataclass(frozen=True, slots=True)
class Remote:
    """How to reach a `serve`: its URL, and the credentials of --from.*, by name."""

    url: str
    _: KW_ONLY
    username: str | None = None
    password_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False


def processes_url(url: str, params: Mapping[str, str]) -> str:
    """`URL/processes?...` of a server's base URL (or of its /processes URL itself)."""
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a port that is no number raises here)
    except ValueError:  # a malformed host ("[::1") or port
        raise BadValue(f"--from {url}: want http://HOST:PORT or https://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadValue(f"--from {url}: want http://HOST:PORT or https://HOST:PORT")
    path = parts.path.rstrip("/")
    if not path.endswith("/processes"):
        path += "/processes"
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, path, urllib.parse.urlencode(params), "")
    )


def _read_secret(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise BadValue(f"{flag} {path}: {getattr(error, 'strerror', None) or error}") from None


def tls_context(remote: Remote) -> ssl.SSLContext:
    """The client side of --from's TLS: the CA to trust (the system's by default), a
    client certificate, or no verification at all."""
    try:
        context = ssl.create_default_context(cafile=remote.ca_file)
    except (OSError, ssl.SSLError) as error:
        raise BadValue(f"--from.ca-file {remote.ca_file}: {_ssl_reason(error)}") from None
    if remote.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if remote.cert_file:
        try:
            context.load_cert_chain(remote.cert_file, remote.key_file)
        except (OSError, ssl.SSLError) as error:
            raise BadValue(f"--from.cert-file {remote.cert_file}: {_ssl_reason(error)}") from None
    return context


def _ssl_reason(error: Exception) -> str:
    if isinstance(error, ssl.SSLError) and error.reason:
        return str(error.reason).replace("_", " ").lower()
    return getattr(error, "strerror", None) or str(error)


class RemoteFeed:
    """GETs of a running `serve`'s `/processes` (docs/reference.md §8)."""

    def __init__(self, remote: Remote, selection: Selection, procfs: ProcFS | None = None):
        self.remote = remote
        self.selection = selection
        self.procfs = procfs  # where --threads checks and reads the served PIDs
        params = dict(selection.filters)
        params["sort"] = selection.sort
        params["limit"] = (
            "0" if selection.threads or selection.limit is None else str(selection.limit)
        )
        self.url = processes_url(remote.url, params)
        parts = urllib.parse.urlsplit(self.url)
        self.origin = f"{parts.scheme}://{parts.hostname}" + (
            f":{parts.port}" if parts.port else ""
        )
        self.headers = {
            "Accept": "application/json",
            "User-Agent": f"procdelta-top/{__version__}",
        }
        if remote.key_file and not remote.cert_file:
            raise BadValue("--from.key-file needs --from.cert-file")
        if remote.password_file and not remote.username:
            raise BadValue("--from.password-file needs --from.username")
        if remote.username is not None:
            password = (
                _read_secret(remote.password_file, "--from.password-file")
                if remote.password_file
                else ""
            )
            token = base64.b64encode(f"{remote.username}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
        self.context = tls_context(remote) if parts.scheme == "https" else None

    def fetch(self) -> View:
        document = self._get()
        pids: dict[int, str] = {}
        if self.selection.threads:
            served = {int(row["pid"]): row["comm"] for row in document["processes"]}
            assert self.procfs is not None
            alike = check_same_node(self.procfs, served, self.origin)
            pids = {pid: served[pid] for pid in alike}
        return View(document, pids)

    def _get(self) -> dict[str, Any]:
        """One GET, trusting the server with nothing: no redirect is followed (procdelta
        never sends one, and the credentials would go along), the whole exchange has
        REQUEST_TIMEOUT (a server sending a byte now and then is cut off there), at most
        MAX_ANSWER_BYTES are read, what the server says is shown as printable text only,
        and the document's shape is checked before anything is drawn."""
        where = f"--from {self.origin}"
        parts = urllib.parse.urlsplit(self.url)
        assert parts.hostname is not None  # `processes_url` refuses a URL without a host
        # The socket is this function's own (below), TLS included: the connection only
        # speaks HTTP over it.
        port = parts.port or (80 if self.context is None else 443)
        connection = http.client.HTTPConnection(parts.hostname, port)
        expired = threading.Event()
        # A second descriptor of the connection's socket: the deadline shuts the socket
        # down through it (waking a read blocked on a server that trickles), whatever
        # holds the first (TLS, during the handshake and after; the answer, which takes
        # it from the connection when it says Connection: close).
        held: list[socket.socket] = []

        def expire() -> None:
            expired.set()
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        deadline = threading.Timer(REQUEST_TIMEOUT, expire)
        deadline.daemon = True
        deadline.start()
        try:
            raw = socket.create_connection(
                (connection.host, connection.port), timeout=REQUEST_TIMEOUT
            )
            held.append(raw)
            held.append(raw.dup())
            if expired.is_set():
                raise TimeoutError
            connection.sock = (
                raw
                if self.context is None
                else self.context.wrap_socket(raw, server_hostname=connection.host)
            )
            connection.request("GET", f"{parts.path}?{parts.query}", headers=self.headers)
            response = connection.getresponse()
            if response.status != 200:
                said = response.read(500)
                raise TopError(f"{where}: {self._refusal(response, said)}")
            body = response.read(MAX_ANSWER_BYTES + 1)
            if expired.is_set():
                raise TimeoutError
        except TopError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as error:
            reason = TimeoutError() if expired.is_set() else error
            raise TopError(f"{where}: {_unreachable(reason)}") from None
        finally:
            deadline.cancel()
            connection.close()
            for sock in held:
                sock.close()
        if len(body) > MAX_ANSWER_BYTES:
            raise TopError(
                f"{where}: an answer over {MAX_ANSWER_BYTES >> 20} MiB is no procdelta "
                "/processes answer"
            )
        values = sum(body.count(token) for token in (b"{", b"[", b",", b":"))
        if values > MAX_ANSWER_VALUES:
            raise TopError(
                f"{where}: an answer of over {MAX_ANSWER_VALUES} values is no procdelta "
                "/processes answer"
            )
        try:
            document = json.loads(body, parse_constant=_no_constant)
        except (ValueError, RecursionError):  # not JSON; NaN, Infinity; nested past the stack
            document = None
        problem = _misshapen(document)
        if problem is not None:
            raise TopError(f"{where}: not a procdelta /processes answer ({problem})")
        return document

    def _refusal(self, response: http.client.HTTPResponse, said: bytes) -> str:
        lines = said.decode("utf-8", "replace").strip().splitlines()
        said_line = printable(lines[0] if lines else response.reason or "")[:200]
        status = response.status
        if status == 401:
            if self.remote.username is None:
                return (
                    "401 Unauthorized: the server wants basic auth; give --from.username "
                    "and --from.password-file"
                )
            return (
                f"401 Unauthorized: the server refused user {self.remote.username!r} "
                "(check --from.username and --from.password-file)"
            )
        if status == 404:
            asked = urllib.parse.urlsplit(self.url).path
            return (
                f"404 Not Found: no {asked} there (a procdelta serve started with "
                "--no-web.processes, or not procdelta; --from takes the server's base URL)"
            )
        if 300 <= status < 400:
            return (
                f"{status}: the server redirects, which procdelta serve never does; not "
                "followed (--from takes the server's own base URL)"
            )
        return f"{status} {said_line}"


def _misshapen(document: object) -> str | None:
    """What is wrong with a /processes answer's shape for drawing it (None: nothing): a
    mapping, its processes each with an integer pid, a name, a group of string labels
    and integer counts, its groups each with a group of labels and counts that are
    integers or null."""
    if not isinstance(document, dict):
        return "not a JSON object"
    processes, groups = document.get("processes"), document.setdefault("groups", [])
    if not isinstance(processes, list) or not isinstance(groups, list):
        return "no list of processes and groups"
    for key in ("interval_seconds", "timestamp"):
        value = document.get(key)
        if value is not None and not _number(value):
            return f"{key} is not a number"
    for kind, rows in (("processes", processes), ("groups", groups)):
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                return f"{kind}[{index}] is not an object"
            labels = row.get("group")
            if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
            ):
                return f"{kind}[{index}].group is not a set of labels"
            if kind == "processes" and not (
                _count(row.get("pid")) and isinstance(row.get("comm"), str)
            ):
                return f"{kind}[{index}] has no pid and comm"
            for name, value in row.items():
                if name not in ("group", "comm") and value is not None and not _count(value):
                    return f"{kind}[{index}].{printable(str(name))[:40]} is not a count"
    return None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _number(value: object) -> bool:
    """A finite number a clock or an interval may be: within ±2^63 (a float beyond converts
    to no time)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < 2**63
    )


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is no JSON number")


def _unreachable(reason: object) -> str:
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"TLS: {reason.verify_message or 'certificate verify failed'} "
            "(give --from.ca-file, or --from.insecure-skip-verify)"
        )
    if isinstance(reason, ssl.SSLError):
        hint = ""
        if "CERTIFICATE_REQUIRED" in str(reason) or "HANDSHAKE_FAILURE" in str(reason):
            hint = " (does it want a client certificate? --from.cert-file, --from.key-file)"
        elif "WRONG_VERSION_NUMBER" in str(reason) or "RECORD_LAYER" in str(reason):
            hint = " (is it plain http?)"
        return f"TLS: {_ssl_reason(reason)}{hint}"
    if isinstance(reason, ConnectionResetError | ConnectionAbortedError) or (
        type(reason).__name__ == "RemoteDisconnected"
    ):
        return "the connection was closed before an answer (is it https?)"
    if isinstance(reason, TimeoutError):
        return f"no answer within {REQUEST_TIMEOUT:g}s (an https URL for a plain http serve?)"
    if isinstance(reason, OSError) and reason.strerror:
        return f"cannot connect: {reason.strerror}"
    if isinstance(reason, http.client.HTTPException):  # what it sent is not HTTP
        return f"not an HTTP answer: {printable(repr(reason))[:120]}"
    return f"cannot connect: {printable(str(reason))[:200]}"
