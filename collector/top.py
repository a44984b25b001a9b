"""`procdelta top`: the processes view (docs/reference.md §8) live, for a person.

Each interval `top` gets one document, the answer of `/processes`: from its own passes
(an engine of its own, `PassView.document`), or from a running `serve` (`--from URL`). For
one group (`--pod`, `--cgroup`) it shows the group's own cgroup above its processes, so
that a wait reads as its own limit, its own threads or its neighbours at a glance; with
`--threads` it reads that group's threads itself, from the proc filesystem, each guarded
like the collector's (docs/reference.md §2), and shows which thread waits.

The view is drawn with rich: on a terminal a live screen (the alternate screen, stdin in
cbreak mode for `q`, both restored however `top` ends); elsewhere plain text, one block
per interval, 80 columns, no escape codes. `--format json` prints one interval's document
and exits.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import math
import os
import selectors
import signal
import socket
import ssl
import sys
import termios
import threading
import time
import tty
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NamedTuple

from rich.console import Console
from rich.console import Group as Stack
from rich.live import Live
from rich.table import Table
from rich.text import Text

from collector import __version__
from collector.model import Malformed, ProcError
from collector.output import group_name, middle_cut
from collector.parse import parse_schedstat, parse_stat, parse_status_switches
from collector.plainread import boottime_ns
from collector.processes import DEFAULT_LIMIT, DEFAULT_SORT, PassView, Query
from collector.procfs import ProcFS

log = logging.getLogger(__name__)

THREAD_FIELDS: tuple[str, ...] = (
    "on_cpu_nanos",
    "run_delay_nanos",
    "voluntary_switches",
    "nonvoluntary_switches",
)
"""A thread's counters in the view, in the names of docs/reference.md §3."""

PLAIN_WIDTH = 80
REQUEST_TIMEOUT = 10.0  # seconds a GET of --from may take, from connecting to its last byte
MAX_ANSWER_BYTES = 32 << 20
"""The most of a server's answer --from reads: a node's every process and group is a few
MiB; more is no procdelta answer, and is not held in memory."""


class TopError(Exception):
    """What stops `top`, in one line for the person who ran it: the work could not be
    done (a server unreachable or refusing, PIDs that are not this node's)."""


class BadValue(TopError):
    """The invocation is wrong: a value `top` cannot take, or options that do not go
    together."""


# --- what to show --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """What the person asked for: one pod or cgroup (or the node), the order, how many
    rows (None: all), and whether the group's processes are split into threads."""

    pod: tuple[str, str] | None = None  # (namespace, name)
    cgroup: str | None = None
    sort: str = DEFAULT_SORT
    limit: int | None = DEFAULT_LIMIT
    threads: bool = False

    @property
    def filters(self) -> tuple[tuple[str, str], ...]:
        if self.pod is not None:
            return (("namespace", self.pod[0]), ("pod", self.pod[1]))
        if self.cgroup is not None:
            return (("cgroup", self.cgroup),)
        return ()

    @property
    def scope(self) -> str:
        if self.pod is not None:
            return f"pod {self.pod[0]}/{self.pod[1]}"
        if self.cgroup is not None:
            return f"cgroup {self.cgroup}"
        return "node"

    def query(self) -> Query:
        """What to ask for: with --threads every process of the group (its threads are all
        read), cut to the limit afterwards (`View.cut`)."""
        return Query(self.filters, self.sort, None if self.threads else self.limit)

    @property
    def thread_sort(self) -> str:
        return self.sort if self.sort in THREAD_FIELDS else DEFAULT_SORT


def parse_pod(value: str) -> tuple[str, str] | None:
    """(namespace, name) of `NAMESPACE/NAME`; None where it is not that."""
    namespace, slash, name = value.partition("/")
    if not (slash and namespace and name) or "/" in name:
        return None
    return namespace, name


# --- threads ---------------------------------------------------------------------------


class ThreadRow(NamedTuple):
    """One thread's delta over the interval between two readings of its counters."""

    pid: int
    tid: int
    comm: str
    on_cpu_nanos: int
    run_delay_nanos: int
    voluntary_switches: int
    nonvoluntary_switches: int

    def as_dict(self) -> dict[str, object]:
        return self._asdict()


class _Seen(NamedTuple):
    """A thread's last reading: its process, start time and counters."""

    pid: int
    start_ticks: int
    counters: tuple[int, int, int, int]  # in the order of THREAD_FIELDS


class ThreadWatch:
    """The threads of a set of processes, read on demand from `task/<tid>/` (`stat`:
    its name and start time; `schedstat`: on-CPU and run delay; `status`: context
    switches), each guarded by (tid, process, start time) like the collector's cache:
    no delta on first sight, when the TID now names another thread, or when a counter
    fell. A thread or process gone meanwhile is simply not seen."""

    def __init__(self, procfs: ProcFS, clock: Callable[[], int] = boottime_ns):
        self.procfs = procfs
        self.clock = clock
        self._seen: dict[int, _Seen] = {}
        self._at_ns: int | None = None
        self.interval_ns: int | None = None  # between the last two readings

    def read(self, pids: Iterable[int]) -> list[ThreadRow]:
        """Read every thread of `pids` now; the deltas of those read the last time too."""
        now = self.clock()
        seen: dict[int, _Seen] = {}
        rows: list[ThreadRow] = []
        for pid in pids:
            try:
                tids = self.procfs.threads(pid)
            except ProcError:
                continue
            task = self.procfs.task_dir(pid)
            for tid, _inode in tids:
                try:
                    stat = parse_stat(self.procfs.read(b"%s%d/stat" % (task, tid)))
                    sched = parse_schedstat(self.procfs.read(b"%s%d/schedstat" % (task, tid)))
                    switches = parse_status_switches(self.procfs.read(b"%s%d/status" % (task, tid)))
                except (ProcError, Malformed):
                    continue
                counters = (
                    sched.on_cpu_ns,
                    sched.run_delay_ns,
                    switches.voluntary,
                    switches.nonvoluntary,
                )
                seen[tid] = reading = _Seen(pid, stat.start_ticks, counters)
                before = self._seen.get(tid)
                if (
                    before is None
                    or before.pid != pid
                    or before.start_ticks != reading.start_ticks
                    or any(n < b for n, b in zip(counters, before.counters, strict=True))
                ):
                    continue
                deltas = (n - b for n, b in zip(counters, before.counters, strict=True))
                rows.append(ThreadRow(pid, tid, stat.comm, *deltas))
        self._seen = seen
        self.interval_ns = None if self._at_ns is None else now - self._at_ns
        self._at_ns = now
        return rows


def local_comm(procfs: ProcFS, pid: int) -> str | None:
    """The name the proc filesystem gives `pid` now; None where it has no such process."""
    try:
        return parse_stat(procfs.process_file(pid, "stat")).comm
    except (ProcError, Malformed):
        return None


def check_same_node(procfs: ProcFS, served: Mapping[int, str], source: str) -> list[int]:
    """The served PIDs whose process here has the served name: those whose threads can be
    read here. TopError where the names disagree (more PIDs named otherwise than alike,
    or none alike): `top` is not on the served node, or not with the host's /proc."""
    alike, other = [], 0
    for pid, comm in served.items():
        here = local_comm(procfs, pid)
        if here == comm:
            alike.append(pid)
        elif here is not None:
            other += 1
    if served and (other > len(alike) or not alike):
        raise TopError(
            f"--threads: the PIDs {source} serves are not this node's processes under "
            f"{procfs.root} ({len(alike)} of {len(served)} with the same name here); run top "
            "on that node with the host's /proc (in procdelta's pod: PROCDELTA_PATH_PROCFS)"
        )
    return alike


# --- where the documents come from -----------------------------------------------------


@dataclass(slots=True)
class View:
    """One interval as `top` shows it: the /processes document, the PIDs of the group's
    processes with their names (what --threads reads), and the group's threads."""

    document: dict[str, Any]
    pids: dict[int, str] = field(default_factory=dict)
    threads: list[ThreadRow] | None = None  # None: not asked for
    threads_interval_ns: int | None = None
    note: str = ""  # what the person should know about this view (a failed refresh, say)

    def cut(self, selection: Selection) -> None:
        """Processes and threads sorted and cut to the selection's limit."""
        limit = selection.limit
        processes = self.document.get("processes") or []
        self.document["processes"] = processes[:limit] if limit is not None else processes
        if self.threads is not None:
            name = selection.thread_sort
            self.threads.sort(key=lambda row: (-getattr(row, name), row.tid))
            if limit is not None:
                del self.threads[limit:]

    def as_json(self) -> dict[str, Any]:
        document = dict(self.document)
        if self.threads is not None:
            document["threads_interval_seconds"] = (
                None if self.threads_interval_ns is None else self.threads_interval_ns / 1e9
            )
            document["threads"] = [row.as_dict() for row in self.threads]
        return document


class LocalSource:
    """Passes of `top`'s own engine; `fetch` runs one and makes its document."""

    def __init__(self, engine, selection: Selection, cgroup_fields: bool = True):
        self.engine = engine
        self.selection = selection
        self.cgroup_fields = cgroup_fields
        self.origin = ""

    def fetch(self) -> View:
        """A pass; its view (after the first pass, with no interval yet, an empty
        document: only the group's PIDs, for the threads' first reading)."""
        result = self.engine.run_pass()
        query = self.selection.query()
        pids: dict[int, str] = {}
        if self.selection.threads:
            pids = dict.fromkeys(result.processes.pids(query), "")
        if result.interval_ns is None:
            return View({}, pids)
        document = PassView.of(result).document(query, self.cgroup_fields)
        return View(document, pids)


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


class RemoteSource:
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
        if self.context is not None:
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=REQUEST_TIMEOUT, context=self.context
            )
        else:
            connection = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=REQUEST_TIMEOUT
            )
        expired = threading.Event()

        def expire() -> None:  # wakes a read blocked on a server that trickles
            expired.set()
            with contextlib.suppress(OSError, AttributeError):
                connection.sock.shutdown(socket.SHUT_RDWR)

        deadline = threading.Timer(REQUEST_TIMEOUT, expire)
        deadline.daemon = True
        deadline.start()
        try:
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
        if len(body) > MAX_ANSWER_BYTES:
            raise TopError(
                f"{where}: an answer over {MAX_ANSWER_BYTES >> 20} MiB is no procdelta "
                "/processes answer"
            )
        try:
            document = json.loads(body)
        except ValueError:
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
    interval = document.get("interval_seconds")
    if interval is not None and not _number(interval):
        return "interval_seconds is not a number"
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
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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


# --- one interval --------------------------------------------------------------------


class Viewer:
    """A source and, with --threads, the group's threads read here: one `View` a call."""

    def __init__(self, source, selection: Selection, threads: ThreadWatch | None = None):
        self.source = source
        self.selection = selection
        self.threads = threads

    @property
    def origin(self) -> str:
        return self.source.origin

    def step(self) -> View | None:
        """The next view (None while `top`'s own first pass has no interval yet)."""
        view = self.source.fetch()
        if self.threads is not None:
            view.threads = self.threads.read(view.pids)
            view.threads_interval_ns = self.threads.interval_ns
        if not view.document:  # a first pass: only the threads' first reading
            return None
        view.cut(self.selection)
        return view


def one_interval(viewer: Viewer, interval: float, sleep=time.sleep) -> View:
    """`--format json`: one interval. Own passes: two, `interval` apart. From a server:
    one GET (with --threads, the threads read twice, `interval` apart)."""
    first = viewer.step()
    if first is not None and viewer.threads is None:
        return first
    sleep(interval)
    if first is not None:  # from a server, with --threads: read the same PIDs again
        first.threads = viewer.threads.read(first.pids)
        first.threads_interval_ns = viewer.threads.interval_ns
        first.cut(viewer.selection)
        return first
    view = viewer.step()
    if view is None:
        raise TopError("the pass over the proc filesystem failed; see the log")
    return view


# --- drawing ---------------------------------------------------------------------------


def short_time(nanos: int | None) -> str:
    """Nanoseconds in at most 5 characters, cut (never rounded up past a unit): 850ns
    850µs 8.5ms 850ms 8.50s 85.0s 850s, minutes from 1000 s, hours from 10000 minutes."""
    if nanos is None:
        return "-"
    if nanos == 0:
        return "0"
    if nanos < 1_000:
        return f"{nanos}ns"
    if nanos < 1_000_000:
        return f"{nanos // 1_000}µs"
    if nanos < 10_000_000:
        return f"{nanos // 100_000 / 10:.1f}ms"
    if nanos < 1_000_000_000:
        return f"{nanos // 1_000_000}ms"
    if nanos < 10_000_000_000:
        return f"{nanos // 10_000_000 / 100:.2f}s"
    if nanos < 100_000_000_000:
        return f"{nanos // 100_000_000 / 10:.1f}s"
    if nanos < 1_000_000_000_000:
        return f"{nanos // 1_000_000_000}s"
    if nanos < 600_000_000_000_000:
        return f"{nanos // 60_000_000_000}m"
    return f"{nanos // 3_600_000_000_000}h"


def short_count(value: int | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000_000:
        return f"{value // 1_000_000}M"
    if value >= 10_000:
        return f"{value // 1_000}k"
    return str(value)


def share(run_delay: int, on_cpu: int) -> str:
    """The run delay's share of the time runnable (on a CPU or waiting for one)."""
    runnable = on_cpu + run_delay
    return "-" if runnable <= 0 else f"{100 * run_delay / runnable:.0f}%"


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, line
    breaks, bells) shown as `?`, as ps does: a process names itself."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else "?" for c in text)


def _text(text: str, width: int | None = None) -> Text:
    """A line or a cell as it is, never read as markup, cut in its middle to `width`."""
    text = printable(text)
    return Text(text if width is None else middle_cut(text, width), no_wrap=True)


def _row_group(labels: Mapping[str, str]) -> str:
    """A process's group in a node-wide view: its pod (namespace/name) or cgroup."""
    try:
        return group_name(dict(labels))
    except KeyError:
        return "?"


# (header, width, field) of the process table; the group's column takes the rest
_PROCESS_COLUMNS = (
    ("PID", 7, "pid"),
    ("COMM", 15, "comm"),
    ("THR", 4, "threads"),
    ("ON-CPU", 6, "on_cpu_nanos"),
    ("RUN-DELAY", 9, "run_delay_nanos"),
    ("WAIT%", 5, None),
    ("USER", 5, "cpu_user_nanos"),
    ("SYS", 5, "cpu_system_nanos"),
)
_THREAD_COLUMNS = (
    ("PID", 7, "pid"),
    ("TID", 7, "tid"),
    ("THREAD", 15, "comm"),
    ("ON-CPU", 6, "on_cpu_nanos"),
    ("RUN-DELAY", 9, "run_delay_nanos"),
    ("WAIT%", 5, None),
    ("VOL-CS", 6, "voluntary_switches"),
    ("INVOL-CS", 8, "nonvoluntary_switches"),
)
_GROUP_COLUMN_MIN = 8


def _cell(name: str | None, item: Mapping[str, Any]) -> str:
    if name is None:
        return share(int(item.get("run_delay_nanos") or 0), int(item.get("on_cpu_nanos") or 0))
    value = item.get(name)
    if name == "comm":
        return str(value)
    if name.endswith("_nanos"):
        return short_time(value)
    if name in ("pid", "tid"):
        return str(value)
    return short_count(value)


def _table(columns, items: Iterable[Mapping[str, Any]], width: int, group_column: bool) -> Table:
    table = Table(
        box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, header_style="bold"
    )
    for header, column_width, name in columns:
        table.add_column(
            header,
            width=column_width,
            justify="left" if name == "comm" else "right",
            no_wrap=True,
            overflow="ellipsis",
        )
    rest = width - sum(w + 1 for _, w, _ in columns)
    if group_column:
        rest = max(rest, _GROUP_COLUMN_MIN)
        table.add_column("GROUP", width=rest, no_wrap=True, overflow="ellipsis")
    for item in items:
        cells = [_text(_cell(name, item)) for _, _, name in columns]
        if group_column:
            cells.append(_text(_row_group(item.get("group") or {}), rest))
        table.add_row(*cells)
    return table


def _percent(part: int | None, whole: int) -> str:
    return "-" if part is None else f"{100 * part / whole:.0f}%"


KERNEL_CAUSES = (
    "cpu_stalled_throttled_nanos",
    "cpu_waiting_own_threads_nanos",
    "cpu_stalled_neighbours_nanos",
)
"""Why a group waited from its CPU pressure (wall time), in the group line's order."""
INTERVAL_CAUSES = tuple(
    f"run_delay_{cause}_nanos" for cause in ("throttled", "own_threads", "neighbours")
)
"""The same from its run delay's split (thread-time), where it has no CPU pressure."""


def _causes_line(what: str, parts: list, whole: int | None = None) -> str:
    """`what` and its three causes, each a share of `whole` (of their sum without it)."""
    total = sum(int(p or 0) for p in parts) if whole is None else whole
    if total <= 0:
        return f"  {what} 0"
    throttled, own, neighbours = (_percent(p, total) for p in parts)
    return (
        f"  {what} {short_time(total)}: {throttled} own limit (throttled)"
        f" · {own} own threads · {neighbours} neighbours"
    )


def group_lines(group: Mapping[str, Any]) -> list[str]:
    """A group's own cgroup, what its processes cannot see (docs/reference.md §7): its
    CPU, throttling and CPU pressure; then why it waited: moment by moment from its CPU
    pressure (wall time), else its run delay split on the interval (thread-time)."""
    labels = group.get("group") or {}
    name = _row_group(labels)
    kind = "pod" if "uid" in labels else "cgroup"
    qos = f"  {labels['qos']}" if labels.get("qos") else ""
    count = group.get("processes")
    noun = "process" if count == 1 else "processes"
    lines = [f"{kind} {name}{qos}  {short_count(count)} {noun} with a delta"]
    cpu = group.get("cgroup_cpu_nanos")
    periods, throttled = group.get("cpu_periods"), group.get("cpu_throttled_periods")
    if cpu is None and periods is None and group.get("cpu_pressure_waiting_nanos") is None:
        lines.append("  own cgroup: no reading this interval (first sight, or not read)")
    else:
        throttling = (
            "-" if periods is None or throttled is None else f"{throttled}/{periods} periods"
        )
        lines.append(
            f"  cgroup CPU {short_time(cpu)}  throttled {throttling},"
            f" {short_time(group.get('cpu_throttled_nanos'))}"
            f"  CPU pressure {short_time(group.get('cpu_pressure_waiting_nanos'))}"
        )
    run_delay = int(group.get("run_delay_nanos") or 0)
    stalled = [group.get(name) for name in KERNEL_CAUSES]
    if all(part is not None for part in stalled):
        lines.append(f"  run delay {short_time(run_delay)}")
        lines.append(_causes_line("wall wait", stalled))
        return lines
    split = [group.get(name) for name in INTERVAL_CAUSES]
    if run_delay <= 0:
        lines.append("  run delay 0")
    elif all(part is None for part in split):
        lines.append(f"  run delay {short_time(run_delay)} (no split by cause this interval)")
    else:
        lines.append(_causes_line("run delay", split, run_delay))
    return lines


def _clock(timestamp: object) -> str:
    if not isinstance(timestamp, int | float):
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(timestamp))


_SORT_NAMES = {"run_delay_nanos": "run delay", "on_cpu_nanos": "on-CPU"}


def render(
    view: View | None,
    selection: Selection,
    width: int,
    origin: str = "",
    interval: float = 2.0,
    live: bool = False,
    height: int | None = None,
) -> Stack:
    """One screen: a header (what, the interval, the time), the group's own cgroup for a
    pod or a cgroup, then its processes (or threads), no more rows than `height` (a
    screen's: those below it are never drawn)."""
    document = view.document if view is not None else {}
    seconds = document.get("interval_seconds")
    sort = _SORT_NAMES.get(selection.sort, selection.sort)
    head = f"procdelta top  {selection.scope}  by {sort}"
    if view is None:
        head += f"  first pass done, the first interval in {interval:g}s"
    elif isinstance(seconds, int | float):
        head += f"  interval {seconds:.2f}s at {_clock(document.get('timestamp'))}"
    else:
        head += "  no interval yet"
    lines = [head]
    if origin:
        lines.append(f"from {origin} (its passes; refreshed every {interval:g}s)")
    if view is not None and view.note:
        lines.append(view.note)
    if live:
        lines.append("q quits")
    parts: list[Any] = [_text(line, width) for line in lines]
    if view is None:
        return Stack(*parts)
    if selection.filters:
        groups = document.get("groups") or []
        if not groups:
            parts.append(_text(f"no process of {selection.scope} in this interval", width))
        for group in groups:
            parts.extend(_text(line, width) for line in group_lines(group))
    parts.append(Text(""))
    if selection.threads and view.threads is not None:
        if view.threads_interval_ns is None:
            parts.append(Text("threads: first reading; their deltas from the next interval"))
        else:
            items = [row.as_dict() for row in view.threads[:height]]
            parts.append(_table(_THREAD_COLUMNS, items, width, group_column=False))
    else:
        processes = (document.get("processes") or [])[:height]
        parts.append(_table(_PROCESS_COLUMNS, processes, width, not selection.filters))
    return Stack(*parts)


def plain_console(file) -> Console:
    """A console that writes plain text: no colour, no escape codes, 80 columns."""
    return Console(
        file=file,
        width=PLAIN_WIDTH,
        force_terminal=False,
        color_system=None,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
    )


# --- running ---------------------------------------------------------------------------


class _Stop(Exception):
    """SIGTERM or SIGHUP: end like `q`, the terminal restored on the way out."""


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    def stop(*_):
        raise _Stop

    saved = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _logs_held() -> Iterator[None]:
    """While the screen is taken, log records wait; they are written after it is given
    back (a line written meanwhile would be drawn over)."""
    root = logging.getLogger()
    held: list[logging.LogRecord] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)
            del held[:-50]

    handlers = root.handlers[:]
    root.handlers[:] = [Hold()]
    try:
        yield
    finally:
        root.handlers[:] = handlers
        for record in held:
            root.handle(record)


@contextlib.contextmanager
def _resizes() -> Iterator[int]:
    """A pipe that gets a byte each time the terminal is resized (SIGWINCH): its read end,
    to wait on beside the keys."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def resized(*_) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(write_end, b".")

    saved = signal.signal(signal.SIGWINCH, resized)
    try:
        yield read_end
    finally:
        signal.signal(signal.SIGWINCH, saved)
        os.close(read_end)
        os.close(write_end)


def run_live(viewer: Viewer, selection: Selection, interval: float) -> None:
    """The live screen until `q`, Ctrl-C, SIGTERM or SIGHUP: stdin in cbreak mode (when
    it is a terminal), the alternate screen; both given back however it ends."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    console = Console()
    try:
        with _signals_stop(), _resizes() as resized:
            if fd is not None:
                tty.setcbreak(fd)
            with (
                _logs_held(),
                Live(
                    console=console,
                    screen=True,
                    auto_refresh=False,
                    redirect_stdout=False,
                    redirect_stderr=False,
                ) as live,
            ):
                _live_loop(live, console, viewer, selection, interval, fd, resized)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _live_loop(
    live: Live,
    console: Console,
    viewer: Viewer,
    selection: Selection,
    interval: float,
    keys: int | None,
    resized: int,
) -> None:
    """Refresh every `interval`, redraw on a resize or a key; return on `q`."""
    view: View | None = None

    def draw() -> None:
        live.update(
            render(view, selection, console.width, viewer.origin, interval, True, console.height),
            refresh=True,
        )

    view = viewer.step()
    draw()
    due = time.monotonic() + interval
    # a selector (epoll), not select(): no bound on the descriptors' numbers
    with selectors.DefaultSelector() as waiting:
        waiting.register(resized, selectors.EVENT_READ)
        if keys is not None:
            waiting.register(keys, selectors.EVENT_READ)
        while True:
            ready = {key.fd for key, _ in waiting.select(max(due - time.monotonic(), 0))}
            if ready:
                if resized in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(resized, 64)
                if keys in ready:
                    typed = os.read(keys, 64)
                    if not typed:
                        waiting.unregister(keys)
                        keys = None  # end of input: no more keys, the refreshes go on
                    elif b"q" in typed.lower():
                        return
                draw()
                continue
            due = max(due + interval, time.monotonic())
            try:
                latest = viewer.step()
            except TopError as error:
                if view is None:
                    raise
                view.note = f"refresh failed: {error}"
            else:
                if latest is not None:
                    view = latest
            draw()


def run_plain(viewer: Viewer, selection: Selection, interval: float, out) -> None:
    """Not on a terminal: one block of plain text per interval, until stopped."""
    console = plain_console(out)
    first = True
    due = time.monotonic()
    try:
        while True:
            view = viewer.step()
            if view is not None:
                with console.capture() as captured:
                    console.print(render(view, selection, PLAIN_WIDTH, viewer.origin, interval))
                text = "\n".join(line.rstrip() for line in captured.get().splitlines())
                out.write(("" if first else "\n") + text + "\n")
                out.flush()
                first = False
            due = max(due + interval, time.monotonic())
            time.sleep(max(due - time.monotonic(), 0))
    except KeyboardInterrupt:
        pass


def print_json(view: View, out) -> None:
    out.write(json.dumps(view.as_json(), indent=2) + "\n")
    out.flush()
