"""HTTP/1.1 as this server speaks it (RFC 9112, RFC 9110), with no socket: the request
heads found in a connection's bytes, each parsed into a `Request` or refused with the
`Response` that says why, and an answer's head. Pure: `collector.listener` does the I/O.

A server that serves two GET routes needs little of HTTP, and every part of it strictly:
a request is a head with no body (RFC 9112 §6.3: none without Content-Length or
Transfer-Encoding); its lines end in CRLF, a bare LF refused at once rather than left to
the head's deadline; a header's name is a token, with no space before its colon (§5.1, a
smuggling vector through a proxy that reads it otherwise); `Host` once, required of
HTTP/1.1 (§3.2). h11 parses the same and more (bodies, chunks, the client's side), and
needs its own loop around it for what this server bounds (docs/design.md, "The listener").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
"""A request line and headers longer than this are refused (431)."""

MAX_HEADER_FIELDS = 100
"""A head with more header fields than this is refused (431), as Apache's
`LimitRequestFields` does by default: a scraper sends fewer than ten."""

REASONS = {
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
    certified: bool = False  # its connection's TLS handshake verified a client certificate

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
            f"HTTP/1.1 {self.status} {REASONS.get(self.status, 'Unknown')}",
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

    @property
    def reason(self) -> str:
        """A refusal's text, for the log line naming the client."""
        return self.body.decode().strip()


def plain(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode())


class Heads:
    """The bytes a connection has received, and the request heads in them, taken one at a
    time in order (a client may pipeline several)."""

    __slots__ = ("data", "scanned")

    def __init__(self) -> None:
        self.data = bytearray()
        self.scanned = 0  # no head's end lies before this offset

    def __len__(self) -> int:
        return len(self.data)

    def add(self, data: bytes) -> None:
        self.data += data

    def take(self) -> bytes | Response | None:
        """The next whole head (taken out of the bytes with the empty line ending it); or
        the answer refusing the bytes (a line ended by LF alone, a head too large); or
        None while no head is whole yet."""
        data = self.data
        if data[:1] in (b"\r", b"\n"):  # empty lines before a request (RFC 9112 §2.2)
            del data[: len(data) - len(data.lstrip(b"\r\n"))]
            self.scanned = 0
        end = data.find(b"\r\n\r\n", self.scanned)
        if _bare_lf(data, self.scanned, len(data) if end < 0 else end):
            # refused at once, not left to the head's deadline
            return plain(400, "a line of the request head ends without CR")
        if end < 0:
            # a head trickled in a byte at a time is scanned once, not once per byte
            self.scanned = max(0, len(data) - 3)
            if len(data) > MAX_HEAD_BYTES:
                return plain(431, "request head too large")
            return None
        if end > MAX_HEAD_BYTES:
            return plain(431, "request head too large")
        head = bytes(data[:end])
        del data[: end + 4]
        self.scanned = 0
        return head


def _bare_lf(buffer: bytearray, start: int, end: int) -> bool:
    """Whether an LF not preceded by CR lies in buffer[start:end]: counted in C, as many
    LFs as CR LFs (a CR right before `start` pairs with an LF at it), not looked at one by
    one (16,000 LFs in a 64 KiB head cost milliseconds that way)."""
    lfs = buffer.count(b"\n", start, end)
    if not lfs:
        return False
    return lfs != buffer.count(b"\r\n", max(start - 1, 0), end)


def read_request(
    head: bytes, client: str, certified: bool = False
) -> tuple[Request, bool] | Response:
    """A whole head's request, and whether the connection closes after its answer; or the
    answer refusing it (400, 405, 413, 431, 505). `certified`: its connection's handshake
    verified a client certificate."""
    parsed = parse_head(head, client, certified)
    if isinstance(parsed, Response):
        return parsed
    request, version = parsed
    refused = refused_shape(request)
    if refused is not None:
        return refused
    close = version == "HTTP/1.0" or has_token(request.headers.get("connection"), "close")
    return request, close


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header field's name (RFC 9110 §5.1, §5.6.2)."""
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")
"""RFC 9110 §12.4.2."""
_VERSION = re.compile(r"HTTP/([0-9])\.[0-9]")
"""RFC 9112 §2.3."""
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/?#]*(?P<path>[/?][^#]*)?")
"""An absolute-form target (RFC 9112 §3.2.2): what follows its authority is the path."""
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(:[0-9]*)?")
"""A `Host` field: uri-host [":" port] (RFC 9110 §7.2, RFC 3986 §3.2.2)."""


def parse_head(head: bytes, client: str, certified: bool = False) -> tuple[Request, str] | Response:
    """The request a head (without its empty line) holds, and its version (`HTTP/1.0`, or
    `HTTP/1.1` for any later 1.x); or a 400 (a malformed line, header or `Host`), a 431
    (too many header fields) or a 505."""
    try:
        text = head.decode("latin-1")
        line, *fields = text.split("\r\n", MAX_HEADER_FIELDS + 1)
        method, target, version = line.split(" ")
    except ValueError:
        return plain(400, "malformed request line")
    if len(fields) > MAX_HEADER_FIELDS:
        return plain(431, f"more than {MAX_HEADER_FIELDS} header fields")
    if any(c in text.replace("\r\n", "") for c in "\r\n\x00"):
        # a bare CR or LF a proxy in front may read as a line's end (RFC 9112 §2.2), a NUL
        return plain(400, "bare CR, LF or NUL in the request head")
    major = _VERSION.fullmatch(version)
    if major is None:
        return plain(400, "malformed request line")
    if major[1] != "1":
        return plain(505, "HTTP/1.1 or HTTP/1.0 only")
    if version != "HTTP/1.0":
        version = "HTTP/1.1"  # a later minor version is read as the highest known (§2.3)
    absolute = _ABSOLUTE.fullmatch(target)
    if absolute is not None:
        path = absolute["path"] or "/"
        target = path if path.startswith("/") else "/" + path
    if not target.startswith("/") or not method.isalpha():
        return plain(400, "malformed request line")
    found: dict[str, list[str]] = {}
    for entry in fields:
        name, colon, value = entry.partition(":")
        # a name is a token: no space before the colon (RFC 9112 §5.1), no control
        # characters, no separators; a line folded onto the last (obs-fold) is none
        if not colon or not _TOKEN.fullmatch(name):
            return plain(400, "malformed header")
        key = name.lower()
        values = found.setdefault(key, [])
        if values and key in ("authorization", "content-length", "host"):
            return plain(400, f"{name} given twice")
        values.append(value.strip(" \t"))
    headers = {key: ", ".join(values) for key, values in found.items()}
    if version == "HTTP/1.1" and "host" not in headers:
        return plain(400, "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)")
    if "host" in headers and not _HOST.fullmatch(headers["host"]):
        return plain(400, "malformed Host header")
    return Request(method, target, headers, client, certified), version


def refused_shape(request: Request) -> Response | None:
    """What this server never answers: a malformed length (400), a body (413), a method
    other than GET and HEAD (405)."""
    length = request.headers.get("content-length")
    if length is not None and not (length.isascii() and length.isdigit()):
        return plain(400, "malformed Content-Length")
    if "transfer-encoding" in request.headers or (length is not None and int(length) != 0):
        return plain(413, "a request body is not accepted")
    if request.method not in ("GET", "HEAD"):
        return Response(405, b"GET or HEAD only\n", headers=(("Allow", "GET, HEAD"),))
    return None


def printable(text: str, limit: int = 200) -> str:
    """`text` as a log line or a terminal may show it: every character outside printable
    ASCII (an escape sequence's ESC, C1 controls, a line's end) as `\\xNN`, `\\uNNNN` or
    `\\UNNNNNNNN`, a backslash as `\\\\`, cut at `limit` characters with `…`."""
    cut = text[:limit]
    shown = "".join(c if " " <= c <= "~" and c != "\\" else _escape(c) for c in cut)
    return shown + ("…" if len(text) > limit else "")


def _escape(c: str) -> str:
    if c == "\\":
        return "\\\\"
    code = ord(c)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def has_token(header: str | None, token: str) -> bool:
    """Whether a header that is a list of tokens (Connection; RFC 9110 §7.6.1) lists
    `token` (lower case): among them, not inside one."""
    return bool(header and token in (part.strip().lower() for part in header.split(",")))


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
