"""HTTP/1.1 as the listener speaks it, with no socket (collector/http11.py): the heads a
connection's bytes hold, each parsed into a request or refused with the answer saying why;
header lists; an answer's head. tests/integration/test_listener_requests.py holds the same over
127.0.0.1."""

from __future__ import annotations

import pytest

from collector.http11 import (
    MAX_HEAD_BYTES,
    MAX_HEADER_FIELDS,
    Heads,
    Request,
    Response,
    _bare_lf,
    accepted,
    has_token,
    plain,
    printable,
    read_request,
)


def take_all(data: bytes) -> list[bytes | Response | None]:
    """What `Heads.take` gives for `data` received at once, until it gives None or a
    refusal."""
    heads = Heads()
    heads.add(data)
    taken: list[bytes | Response | None] = []
    while True:
        taken.append(heads.take())
        if not isinstance(taken[-1], bytes):
            return taken


def answer_to(data: bytes) -> Response | tuple[Request, bool]:
    """The first request in `data`, or the answer refusing it."""
    head = take_all(data)[0]
    assert head is not None, "no whole head"
    return head if isinstance(head, Response) else read_request(head, "192.0.2.1")


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (b"GARBAGE\r\n\r\n", 400, "malformed request line"),
        (b"GET /  HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        (b"GET / HTTP/2.0\r\n\r\n", 505, "HTTP/1.1 or HTTP/1.0 only"),
        (b"GET / HTTQ/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        (b"GET ftp:x HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        (b"GET / HTTP/1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        (b"GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505, "HTTP/1.1 or HTTP/1.0 only"),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "malformed Host header"),
        (b"GET / HTTP/1.1\r\nHost: x/y\r\n\r\n", 400, "malformed Host header"),
        (b"GET / HTTP/1.1\r\nHost: x:8o\r\n\r\n", 400, "malformed Host header"),
        (b"GET / HTTP/1.1\r\nHost: u@x\r\n\r\n", 400, "malformed Host header"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", 400,
         "malformed Content-Length"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400,
         "malformed Content-Length"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n", 400,
         "malformed Content-Length"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: \xd9\xa1\r\n\r\n", 400,
         "malformed Content-Length"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: a\r\n" * MAX_HEADER_FIELDS + b"\r\n", 431,
         f"more than {MAX_HEADER_FIELDS} header fields"),
        (b"G3T / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n", 400, "malformed header"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n", 400, "malformed header"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\n", 400, "malformed header"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX\x01Y: a\r\n\r\n", 400, "malformed header"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n(X): a\r\n\r\n", 400, "malformed header"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\nauthorization: b\r\n\r\n",
         400, "authorization given twice"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
         400, "Content-Length given twice"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "Host given twice"),
        (b"GET / HTTP/1.1\r\n\r\n", 400,
         "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\rB: c\r\n\r\n", 400,
         "bare CR, LF or NUL in the request head"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400,
         "bare CR, LF or NUL in the request head"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\nB: c\r\n\r\n", 400,
         "a line of the request head ends without CR"),
        (b"GET / HTTP/1.1\nHost: x\n\n", 400, "a line of the request head ends without CR"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 413,
         "a request body is not accepted"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 413,
         "a request body is not accepted"),
        (b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", 405, "GET or HEAD only"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", 431,
         "request head too large"),
    ],
)  # fmt: skip
def test_each_malformed_head_is_refused_with_its_reason(data, status, reason):
    answer = answer_to(data)
    assert isinstance(answer, Response), answer
    assert (answer.status, answer.reason) == (status, reason)
    assert answer.body == (reason + "\n").encode()


def test_a_405_names_what_is_served():
    answer = answer_to(b"PUT / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(answer, Response) and answer.headers == (("Allow", "GET, HEAD"),)


@pytest.mark.parametrize(
    ("data", "close"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, CLOSE\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: x-not-close\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: closed\r\n\r\n", False),
        (b"HEAD / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", False),
        (b"GET / HTTP/1.2\r\nHost: x\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 000\r\n\r\n", False),
    ],
)
def test_a_request_is_read_with_whether_its_connection_closes(data, close):
    answer = answer_to(data)
    assert isinstance(answer, tuple), answer
    assert answer[1] is close


def test_a_request_keeps_its_parts_and_joins_a_repeated_headers_values():
    request, _ = answer_to(
        b"GET /processes?sort=cpu&limit=5 HTTP/1.1\r\nHost: x\r\n"
        b"Accept: text/plain\r\nACCEPT:  */* \t\r\nX-Empty:\r\n\r\n"
    )
    assert request == Request(
        "GET",
        "/processes?sort=cpu&limit=5",
        {"host": "x", "accept": "text/plain, */*", "x-empty": ""},
        "192.0.2.1",
    )
    assert (request.path, request.query) == ("/processes", "sort=cpu&limit=5")
    assert (Request("GET", "/", {}, "c").path, Request("GET", "/", {}, "c").query) == ("/", "")


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("http://x:9746/metrics", "/metrics"),
        ("https://x/processes?pod=a", "/processes?pod=a"),
        ("http://x", "/"),
        ("http://x?a=1", "/?a=1"),
    ],
)
def test_an_absolute_form_target_is_served_as_its_path(target, path):
    """RFC 9112 §3.2.2: a server MUST accept the absolute form (a proxy's), and reads the
    path after its authority."""
    request, _ = answer_to(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert request.target == path


def test_a_later_http_1_minor_version_is_read_as_http_1_1():
    """RFC 9112 §2.3: a recipient reads a later minor version as the highest it knows, so
    HTTP/1.2 is HTTP/1.1 (its Host required, kept alive by default), not 505."""
    assert isinstance(answer_to(b"GET / HTTP/1.2\r\n\r\n"), Response)
    _, close = answer_to(b"GET / HTTP/1.9\r\nHost: x\r\n\r\n")
    assert not close


@pytest.mark.parametrize(
    "host", ["x", "", "x:9746", "x:", "127.0.0.1:80", "[::1]:9746", "[::1]", "a-b.c_d~e%41"]
)
def test_a_host_of_any_valid_form_is_taken(host):
    request, _ = answer_to(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert request.headers["host"] == host


def test_many_repeated_fields_cost_a_join_each_not_a_copy_each():
    """A head of header lines all of one name is joined once: a copy of the joined value at
    each line would cost the square of the head's size (16,000 lines of `a:`, 64 KiB)."""
    lines = MAX_HEADER_FIELDS - 1
    request, _ = answer_to(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"A: v\r\n" * lines + b"\r\n")
    assert request.headers["a"] == ", ".join(["v"] * lines)
    refused = answer_to(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * 16_000 + b"\r\n")
    assert isinstance(refused, Response) and refused.status == 431


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("/metrics", "/metrics"),
        ("/\x1b]0;owned\x07", "/\\x1b]0;owned\\x07"),
        ("/\x9b31m", "/\\x9b31m"),
        ("/a\\x1b", "/a\\\\x1b"),
        ("/\u202e", "/\\u202e"),
        ("/" + "a" * 300, "/" + "a" * 199 + "…"),
    ],
)
def test_what_a_client_sent_is_logged_printable(text, shown):
    """An escape sequence (ESC, OSC, a C1 CSI) in a path reaches a log line, and from it an
    operator's terminal, as text; a backslash is doubled, so no escape can be forged."""
    assert printable(text) == shown


def test_only_spaces_and_tabs_are_trimmed_from_a_header_value():
    """Optional white space around a field value is SP and HTAB (RFC 9110 §5.6.3); other
    bytes Python counts as white space (NBSP, NEL in latin-1; VT) are the value's own."""
    request, _ = answer_to(b"GET / HTTP/1.1\r\nHost: x\r\nX-Value: \t X\xa0v\x85X\x0b \t\r\n\r\n")
    assert request.headers["x-value"] == "X\xa0v\x85X\x0b"


def test_pipelined_heads_are_taken_one_at_a_time_in_order_after_empty_lines():
    one = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    two = b"GET /b HTTP/1.0\r\n\r\n"
    taken = take_all(b"\r\n\r\n" + one + b"\r\n" + two + b"GET /c")
    assert taken == [one[:-4], two[:-4], None]


def test_a_head_trickled_in_is_taken_whole_once_its_end_comes():
    data = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    heads = Heads()
    for at in range(len(data) - 1):
        heads.add(data[at : at + 1])
        assert heads.take() is None
        assert 0 <= heads.scanned <= at + 1
        assert heads.scanned >= at - 2  # scanned once, not from its start at every byte
    heads.add(data[-1:])
    assert heads.take() == data[:-4]
    assert len(heads) == 0 and heads.scanned == 0


class _Examined(bytearray):
    """A connection's bytes that count how many of them each search examines."""

    examined = 0

    def find(self, sub, start=None, end=None):
        low = 0 if start is None else start
        high = len(self) if end is None else min(end, len(self))
        self.examined += max(0, high - low)
        return super().find(sub, start, end)


def test_a_head_trickled_in_a_byte_at_a_time_is_searched_once_not_once_per_byte():
    """A client sending its head a byte at a time must not make each byte cost a search of
    all the bytes before it (64 KiB a byte at a time would be 2 GB of searching)."""
    data = b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 8000 + b"\r\n\r\n"
    heads = Heads()
    heads.data = _Examined()
    for at in range(len(data) - 1):
        heads.add(data[at : at + 1])
        assert heads.take() is None
    heads.add(data[-1:])
    assert heads.take() == data[:-4]
    # two searches (a head's end, a bare LF) of each byte and of the 3 kept back
    assert heads.data.examined <= 2 * 4 * len(data)


def test_a_bare_lf_in_a_request_pipelined_behind_a_head_refuses_only_that_request():
    one = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    assert take_all(one + b"GET /b HTTP/1.1\n") == [
        one[:-4],
        plain(400, "a line of the request head ends without CR"),
    ]


def test_a_head_with_no_end_is_refused_past_its_bound_not_buffered_on():
    heads = Heads()
    heads.add(b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES - 19))
    assert len(heads) == MAX_HEAD_BYTES and heads.take() is None
    heads.add(b"a")
    assert heads.take() == plain(431, "request head too large")


def test_a_head_ending_just_within_its_bound_is_taken():
    line = b"GET / HTTP/1.1\r\nHost: x\r\nX: "
    head = line + b"a" * (MAX_HEAD_BYTES - len(line))
    assert len(head) == MAX_HEAD_BYTES
    assert take_all(head + b"\r\n\r\n")[0] == head
    assert take_all(head + b"a\r\n\r\n")[0] == plain(431, "request head too large")


def test_a_bare_lf_is_refused_before_the_head_ends():
    """A client whose lines end in LF alone never sends CR LF CR LF: refused as soon as one
    line is in, not left to the head's deadline."""
    heads = Heads()
    heads.add(b"GET / HTTP/1.1\n")
    answer = heads.take()
    assert isinstance(answer, Response) and answer.status == 400
    heads = Heads()
    heads.add(b"\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")  # an empty line first: skipped
    assert isinstance(heads.take(), bytes)
    heads = Heads()
    heads.add(b"GET / HTTP/1.1\nHost: x\r\n")  # a line ended right after the bare LF
    assert heads.take() == plain(400, "a line of the request head ends without CR")


@pytest.mark.parametrize(
    ("data", "bare"),
    [
        (b"\nGET\r", True),  # an LF first has no CR before it (not the one at the end)
        (b"A\r\nB\nC", True),
        (b"A\r\nB\nC\r\nD", True),  # each LF looked at, not only the first and the last
        (b"A\r\n\nB", True),  # an LF right after another
        (b"A\r\nB\r\n", False),
        (b"", False),
    ],
)
def test_an_lf_is_bare_unless_a_cr_is_right_before_it(data, bare):
    assert _bare_lf(bytearray(data), 0, len(data)) is bare


@pytest.mark.parametrize(
    ("header", "token", "expected"),
    [
        (None, "close", False),
        ("", "close", False),
        ("close", "close", True),
        ("Close", "close", True),
        (" keep-alive ,close ", "close", True),
        ("x-close", "close", False),
        ("close-ish, keep-alive", "close", False),
    ],
)
def test_a_token_list_is_read_as_a_list(header, token, expected):
    assert has_token(header, token) is expected


def test_an_answers_head_is_its_status_type_length_nosniff_headers_then_close():
    response = Response(503, b"busy\n", headers=(("Retry-After", "1"),))
    assert response.head(close=True) == (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 5\r\nX-Content-Type-Options: nosniff\r\nRetry-After: 1\r\n"
        b"Connection: close\r\n\r\n"
    )
    assert Response(299).head(close=False) == (
        b"HTTP/1.1 299 Unknown\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 0\r\nX-Content-Type-Options: nosniff\r\n\r\n"
    )
    assert plain(404, "not found") == Response(404, b"not found\n")
    assert plain(404, "not found").reason == "not found"


@pytest.mark.parametrize(
    ("header", "token", "wildcard", "expected"),
    [
        (None, "gzip", "*", False),
        ("gzip", "gzip", "*", True),
        ("GZIP", "gzip", "*", True),
        ("gzip;q=0", "gzip", "*", False),
        ("gzip; q=0.000, identity", "gzip", "*", False),
        ("deflate, gzip;q=0.5", "gzip", "*", True),
        ("gzip;q=1.0", "gzip", "*", True),
        ("gzip;q=2", "gzip", "*", False),  # no such weight
        ("gzip;q=nan", "gzip", "*", False),
        ("gzip;q=0=1", "gzip", "*", False),  # a malformed weight, not a parameter `q=0`
        ("*", "gzip", "*", True),
        ("*;q=0", "gzip", "*", False),
        ("*, gzip;q=0", "gzip", "*", False),  # named: the wildcard does not reach it
        ("identity", "gzip", "*", False),
        ("application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1",
         "application/openmetrics-text", None, True),
        ("application/openmetrics-text;q=0,text/plain",
         "application/openmetrics-text", None, False),
        ("*/*", "application/openmetrics-text", None, False),
    ],
)  # fmt: skip
def test_header_lists_are_read_with_their_weights(header, token, wildcard, expected):
    """RFC 9110 section 12.4.2: `gzip;q=0` says no gzip."""
    assert accepted(header, token, wildcard) is expected


def test_the_wildcard_of_a_header_list_is_a_star_unless_named():
    """Accept-Encoding's `*` stands for any coding not listed, unless another (Accept's
    `*/*`) or none is named."""
    assert accepted("*", "gzip") and accepted("deflate, *;q=0.5", "gzip")
    assert not accepted("*", "gzip", wildcard=None) and not accepted("deflate", "gzip")
