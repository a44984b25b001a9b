"""`procdelta bench`: what a pass costs, as ratios to a naive reader measured in the same run.

For each synthetic process table (collector/synthetic.py) it measures, interleaved over
rounds: (a) procdelta's pass; (b) the naive floor, a lean reader of every file a full
pass needs (`stat` and `cgroup` per process; `schedstat`, `status` and `io` per thread)
with minimal parsing; (c) where Debian's prometheus-process-exporter is installed, its
CPU per scrape of the same table. Medians; ratios to (b). Then, over the same table,
what a node pays for the whole collector: (d) a real `procdelta serve` in a process of its
own, scraped once a pass as Prometheus scrapes it, its whole CPU per pass (the pass,
building, rendering and compressing the page, garbage collection, answering the scrape),
as a ratio to the same floor; (e) what a request of its processes view (`/processes`, the
default query and every process) costs that process, against the floor measured beside
each request; and what it ships: series and bytes per pod on its page, for each switch.
Then the RSS of a real `procdelta serve` (N=1000 and N=5000) and the latency of `/metrics`
with 1000 groups while passes run. Machines are noisy: read the ratios, not the absolute times.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple

import psutil

from collector.cgroupfs import detect
from collector.engine import PassResult
from collector.groups import Group
from collector.model import COUNTER_FIELD_NAMES, FIELD_NAMES, Fields
from collector.wiring import Options, build_engine


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 8192)
    finally:
        os.close(fd)


def naive_pass(root: str = "/proc") -> tuple[int, int]:
    """The floor: every file a full pass needs, read once, split into fields. (procs, threads)"""
    processes = threads = 0
    for name in os.listdir(root):
        if not name.isdigit():
            continue
        base = f"{root}/{name}"
        try:
            stat = _read(f"{base}/stat")
            stat[stat.rfind(b")") + 2 :].split()
            _read(f"{base}/cgroup").split(b"\n")
            for tid in os.listdir(f"{base}/task"):
                task = f"{base}/task/{tid}"
                _read(f"{task}/schedstat").split()
                _read(f"{task}/status").split(b"\n")
                _read(f"{task}/io").split(b"\n")
                threads += 1
        except OSError:
            continue
        processes += 1
    return processes, threads


@dataclass
class Sample:
    cpu: float
    wall: float


def _measure(action: Callable[[], object]) -> Sample:
    cpu, wall = time.process_time(), time.perf_counter()
    action()
    return Sample(time.process_time() - cpu, time.perf_counter() - wall)


def _pass_worker(options: str) -> None:
    """One measured party of a table, in a process of its own: procdelta with `options`
    (`Options` as JSON), or (an empty string) the floor. Each line read runs one pass and
    answers its CPU and wall seconds; the end of its input ends it. A process of its own,
    as in a running collector: its garbage collector scans its own objects only
    (variants sharing one process would each pay for scanning the others' caches)."""
    if options:  # as `serve` builds it
        action = build_engine(Options(**json.loads(options)), freeze_gc=True).run_pass
    else:
        action = naive_pass
    for _ in sys.stdin:
        sample = _measure(action)
        print(sample.cpu, sample.wall, flush=True)


@contextlib.contextmanager
def _measured_apart(parties: list[Options | None]) -> Iterator[list[Callable[[], Sample]]]:
    """One `_pass_worker` per party; yields, for each, a call that runs one of its passes
    and returns its `Sample`. Every worker is ended and reaped on the way out."""
    started: list[subprocess.Popen[str]] = []

    def one_pass(worker: subprocess.Popen[str]) -> Sample:
        worker.stdin.write("pass\n")
        worker.stdin.flush()
        answer = worker.stdout.readline().split()
        if len(answer) != 2:
            raise RuntimeError(f"a bench worker ended (status {worker.wait()})")
        return Sample(float(answer[0]), float(answer[1]))

    try:
        for options in parties:
            argument = "" if options is None else json.dumps(asdict(options))
            code = "import sys; from collector.bench import _pass_worker; _pass_worker(sys.argv[1])"
            started.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, argument],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        yield [functools.partial(one_pass, worker) for worker in started]
    finally:
        for worker in started:
            with contextlib.suppress(OSError):
                worker.stdin.close()
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            worker.stdout.close()


def _thread_cpu_ns(pid: int) -> int:
    """On-CPU ns of every thread of another process, from its schedstat files."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            total += int(_read(f"/proc/{pid}/task/{tid}/schedstat").split()[0])
    return total


@contextlib.contextmanager
def pod_cgroups(pods: int, root: str = "/sys/fs/cgroup") -> Iterator[str | None]:
    """`pods` pod cgroups laid out as kubelet does with the cgroupfs driver
    (`kubepods/burstable/pod<uid>/<container>`, an app and a pause container each) in every
    hierarchy under `root` that procdelta reads; yields the path of a file naming each
    pod's app container for collector/synthetic.py. Everything made is removed after."""
    if not pods:
        yield None
        return
    hierarchies = detect(root)
    roots = list(
        dict.fromkeys(r for r in (hierarchies.v2, hierarchies.cpu, hierarchies.cpuacct) if r)
    )
    if not roots:
        raise RuntimeError(f"no cgroup hierarchy under {root}: the pods table needs one")
    made: list[str] = []
    lines: list[str] = []
    directory = tempfile.mkdtemp(prefix="procdelta-bench-pods-")
    try:
        for index in range(pods):
            uid = f"{index:08x}-b0b0-4000-8000-{os.getpid():012x}"
            app, pause = f"{index:032x}" * 2, f"{index + 1 << 100:032x}" * 2
            procs = []
            for hierarchy in roots:
                base = os.path.join(os.fsdecode(hierarchy), "kubepods", "burstable", f"pod{uid}")
                for path in (os.path.dirname(os.path.dirname(base)), os.path.dirname(base), base):
                    if not os.path.isdir(path):
                        os.mkdir(path)
                        made.append(path)
                for container in (app, pause):
                    os.mkdir(os.path.join(base, container))
                    made.append(os.path.join(base, container))
                procs.append(os.path.join(base, app, "cgroup.procs"))
            lines.append("\t".join(procs))
        pods_file = os.path.join(directory, "pods")
        with open(pods_file, "w") as out:
            out.write("\n".join(lines) + "\n")
        yield pods_file
    finally:
        for path in reversed(made):
            for _ in range(100):  # the table's processes take a moment to leave
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.05)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def synthetic_table(
    processes: int, mode: str, share: float = 0.1, threads: int = 20, pods_file: str | None = None
):
    table = subprocess.Popen(
        [sys.executable, "-m", "collector.synthetic", str(processes), str(share),
         str(threads), mode, "", *([pods_file] if pods_file else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        if table.stdout.readline().strip() != "ready":
            raise RuntimeError("the synthetic table did not start")
        yield table
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(table.pid, signal.SIGKILL)
        table.wait()
        deadline = time.time() + 10
        while time.time() < deadline and _task_count() > _BASELINE_TASKS + 50:
            time.sleep(0.1)


PID_MAX = "/proc/sys/kernel/pid_max"


@contextlib.contextmanager
def pid_room(tasks: int, path: str = PID_MAX) -> Iterator[None]:
    """Room in the PID space for `tasks` more tasks (every thread takes a PID): where
    `kernel.pid_max` is below twice what the table and the machine need, it is raised
    for the table's span and restored after (a 15k-thread table on a host left at
    32768 would otherwise fail to fork or wrap PIDs mid-measure)."""
    current = int(_read(path))
    wanted = 2 * (tasks + _task_count())
    if current >= wanted:
        yield
        return
    with open(path, "w") as out:
        out.write(str(wanted))
    try:
        yield
    finally:
        with open(path, "w") as out:
            out.write(str(current))


def _task_count() -> int:
    return int(_read("/proc/loadavg").split()[3].split(b"/")[1])


_BASELINE_TASKS = _task_count()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process_exporter() -> Iterator[tuple[int, int] | None]:
    """Debian's prometheus-process-exporter, default options, every process by name."""
    binary = shutil.which("prometheus-process-exporter")
    if binary is None:
        yield None
        return
    directory = tempfile.mkdtemp(prefix="procdelta-bench-")
    config = os.path.join(directory, "config.yml")
    with open(config, "w") as out:
        out.write("process_names:\n  - name: '{{.Comm}}'\n    cmdline: ['.+']\n")
    port = _free_port()
    exporter = subprocess.Popen(
        [binary, "-config.path", config, "-web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                _scrape(port)
                break
            time.sleep(0.1)
        # one that never answered is measured anyway: its first scrape fails, and the
        # table says so (`failed`) instead of stopping the bench
        yield exporter.pid, port
    finally:
        exporter.kill()
        exporter.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _scrape(port: int, path: str = "/metrics") -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        return connection.getresponse().read()
    finally:
        connection.close()


# What Prometheus sends when it scrapes: Prometheus 3's default `scrape_protocols`
# (config.DefaultScrapeProtocols) joined by scrape/scrape.go's acceptHeader() with its
# default name escaping (allow-utf-8), and `Accept-Encoding: gzip` (enable_compression).
# Any OpenMetrics in it gets procdelta's OpenMetrics page, as under Prometheus 2.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
SERVED_INTERVAL = 0.5  # short, so that many passes fit in a few seconds: the CPU per pass counts
SERVED_WARMUP = 3  # passes before the measure: the cache holds the table, quiet cgroups carried
SERVED_PASSES = 30


def _pod_ids(pods_file: str) -> list[tuple[str, str]]:
    """(uid, app container ID) of each pod of a `pod_cgroups` file, in its order."""
    ids = []
    with open(pods_file) as lines:
        for line in lines:
            if line.strip():
                container = os.path.dirname(line.split("\t")[0])
                pod = os.path.basename(os.path.dirname(container))
                ids.append((pod.removeprefix("pod"), os.path.basename(container)))
    return ids


_NAMESPACES = ("payments", "checkout", "search", "identity", "catalog", "ingress-nginx")
_NAME_CHARACTERS = "bcdfghjklmnpqrstvwxz2456789"  # what kube's rand.SafeEncodeString draws from


@contextlib.contextmanager
def pod_names(pods_file: str) -> Iterator[tuple[str, str]]:
    """kubelet's two log directories (collector/groups.py `PodNames`) naming the pods of a
    `pod_cgroups` file as a node names a Deployment's pods: a namespace, a pod name with its
    ReplicaSet's hash and its own suffix, and the app container named after the Deployment,
    so that the page's labels are as long as a node's. Yields (pod logs, container logs);
    removed after."""
    directory = tempfile.mkdtemp(prefix="procdelta-bench-names-")
    pod_logs, container_logs = (os.path.join(directory, d) for d in ("pods", "containers"))
    os.mkdir(pod_logs)
    os.mkdir(container_logs)
    try:
        for index, (uid, app) in enumerate(_pod_ids(pods_file)):
            draw = random.Random(index)
            namespace = _NAMESPACES[index % len(_NAMESPACES)]
            deployment = f"{namespace}-api-{index // len(_NAMESPACES)}"
            hash_, suffix = ("".join(draw.choices(_NAME_CHARACTERS, k=k)) for k in (10, 5))
            pod = f"{deployment}-{hash_}-{suffix}"
            os.mkdir(os.path.join(pod_logs, f"{namespace}_{pod}_{uid}"))
            log = os.path.join(container_logs, f"{pod}_{namespace}_{deployment}-{app}.log")
            with open(log, "w"):
                pass
        yield pod_logs, container_logs
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Page:
    """One scrape of /metrics: the page and what it weighed on the wire."""

    text: bytes  # uncompressed
    shipped: int  # bytes of the body as sent (gzipped, since the scrape asks for it)

    def value(self, name: str) -> float | None:
        """The value of the sample line `name` (no labels), if the page has it."""
        found = re.search(rb"^%s (\S+)" % re.escape(name.encode()), self.text, re.MULTILINE)
        return None if found is None else float(found[1])

    @property
    def passes(self) -> int:
        return int(self.value("procdelta_passes_total") or 0)


class Scraper:
    """Scrapes a `procdelta serve` as Prometheus does: one kept-alive connection, its
    Accept and Accept-Encoding headers."""

    def __init__(self, port: int, timeout: float = 30):
        self.port, self.timeout = port, timeout
        self._connection: http.client.HTTPConnection | None = None

    def scrape(self) -> Page:
        if self._connection is None:
            self._connection = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=self.timeout
            )
        try:
            self._connection.request(
                "GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
            )
            response = self._connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            self.close()  # the next scrape connects anew, as Prometheus would
            raise
        if response.status != 200:
            raise RuntimeError(f"/metrics answered {response.status}")
        gzipped = response.getheader("Content-Encoding") == "gzip"
        return Page(gzip.decompress(body) if gzipped else body, len(body))

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


@contextlib.contextmanager
def served(
    args: Sequence[str] = (), interval: float = SERVED_INTERVAL, timeout: float = 60
) -> Iterator[tuple[int, Scraper]]:
    """A real `procdelta serve` (`python -m collector serve`) with `args`, in a process of its
    own; yields its PID and a `Scraper` once /metrics answers. Stopped and reaped after."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "collector", "serve", "--interval", f"{interval:g}",
         "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "error", *args],
    )  # fmt: skip
    scraper = Scraper(port)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"procdelta serve ended (status {server.returncode})")
            try:
                scraper.scrape()
                break
            except (OSError, http.client.HTTPException) as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"procdelta serve never answered: {error}") from None
                time.sleep(0.1)
        yield server.pid, scraper
    finally:
        scraper.close()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _until_passes(scraper: Scraper, passes: int, timeout: float = 60, poll: float = 0.1) -> Page:
    """The first page that counts `passes` completed passes."""
    deadline = time.monotonic() + timeout
    while True:
        page = scraper.scrape()
        if page.passes >= passes:
            return page
        if time.monotonic() > deadline:
            raise RuntimeError(f"procdelta serve completed {page.passes} of {passes} passes")
        time.sleep(poll)


def _halfway(scraper: Scraper, interval: float) -> float:
    """The monotonic instant halfway between the pass that completes next and the one
    after it (a pass starts every `interval`: found from the moment the page's pass
    count moves, and the mean pass duration the page gives)."""
    page = scraper.scrape()
    seen, deadline = page.passes, time.monotonic() + 10 * interval + 30
    while page.passes == seen:  # the moment a pass completes
        if time.monotonic() > deadline:
            raise RuntimeError(f"procdelta serve completed no pass after its {seen}th")
        time.sleep(0.005)
        page = scraper.scrape()
    completed = time.monotonic()
    count = page.value("procdelta_pass_duration_seconds_count") or 1
    duration = (page.value("procdelta_pass_duration_seconds_sum") or 0) / count
    return completed + max(0.0, interval - duration) / 2


@dataclass
class Served:
    """The whole serve process's CPU over a span of passes, scraped once a pass."""

    cpu_per_pass: float  # s: psutil user+system (all threads) over the span / passes in it
    passes: int  # completed in the span, as the page counts them
    per_pass: list[float]  # s: each scrape-to-scrape span that held one pass (schedstat, ns)
    misaligned: int  # scrape-to-scrape spans that held no pass or more than one
    floor: list[float] = field(default_factory=list)  # s: the floor's passes in the span


def measure_served(
    pid: int,
    scraper: Scraper,
    passes: int = SERVED_PASSES,
    warmup: int = SERVED_WARMUP,
    interval: float = SERVED_INTERVAL,
    floor: Callable[[], Sample] | None = None,
) -> Served:
    """Scrape once a pass, halfway between two passes (a pass starts every `interval`: the
    phase is found from the moment the page's pass count moves), so that the span from the
    first scrape to the last holds whole passes only, and as many scrapes as passes. The CPU
    is the process's own (psutil: every thread, living or gone), read right after the first
    and the last scrape; the passes are the page's `procdelta_passes_total`. Each
    scrape-to-scrape span's CPU (the threads' schedstat, to the ns) gives the spread.
    With `floor`, one pass of the floor (in its own process) right after each scrape,
    halfway between two passes of the served process: the floor of the same span, as a
    pass row's floor is measured in the same rounds as its passes."""
    process = psutil.Process(pid)
    _until_passes(scraper, warmup, poll=interval / 5)
    at = _halfway(scraper, interval)
    time.sleep(max(0.0, at - time.monotonic()))
    first = last = scraper.scrape().passes
    cpu = sum(process.cpu_times()[:2])
    thread_ns = _thread_cpu_ns(pid)
    per_pass: list[float] = []
    floors: list[float] = []
    misaligned = 0
    deadline = time.monotonic() + 4 * passes * interval + 60
    while last - first < passes:
        at += interval
        time.sleep(max(0.0, at - time.monotonic()))
        now = scraper.scrape().passes
        now_ns = _thread_cpu_ns(pid)
        if floor is not None:
            floors.append(floor().cpu)
        if now - last == 1:
            per_pass.append((now_ns - thread_ns) / 1e9)
        else:
            misaligned += 1
        last, thread_ns = now, now_ns
        if time.monotonic() > deadline:
            raise RuntimeError(f"procdelta serve completed {last - first} of {passes} passes")
    cpu = sum(process.cpu_times()[:2]) - cpu
    return Served(cpu / (last - first), last - first, per_pass, misaligned, floors)


# The queries of /processes the bench asks a served process (docs/reference.md §8): the
# default (sorted by run delay, the first 20) and every process (`limit=0`), by row name
VIEW_QUERIES: tuple[tuple[str, str], ...] = (("view", ""), ("view all", "limit=0"))
VIEW_REQUESTS = 20


@dataclass
class ViewCost:
    """Requests of `/processes` with one query, each halfway between two passes."""

    query: str
    cpu: list[float]  # s: the serve process's CPU (every thread's schedstat) for each request
    wall: list[float]  # s: each request's latency at the client, from sending to the last byte
    floor: list[float]  # s: a pass of the floor (its own process) after each request
    listed: int  # processes in the last answer
    body_bytes: int  # its JSON's bytes
    misaligned: int = 0  # requests a pass completed beside, left out


def measure_view(
    pid: int,
    scraper: Scraper,
    query: str = "",
    requests: int = VIEW_REQUESTS,
    interval: float = SERVED_INTERVAL,
    floor: Callable[[], Sample] | None = None,
) -> ViewCost:
    """Ask a served process for `/processes?query` once a pass, halfway between two passes,
    on one kept-alive connection (as a client polling it each interval): the process's CPU
    for the request (every thread's schedstat, read before it and a moment after its last
    byte: the event loop, the views thread making the document and its JSON, the write)
    and its latency at the client. A /metrics scrape before and after each request tells
    whether a pass completed beside it: such a request is left out. With `floor`, one pass
    of the floor right after each request: the floor of the same span."""
    path = "/processes" + (f"?{query}" if query else "")
    connection = http.client.HTTPConnection("127.0.0.1", scraper.port, timeout=scraper.timeout)

    def ask() -> bytes:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}: {body[:200]!r}")
        return body

    settle = 0.01  # the server's thread asleep again after its last byte
    cpu: list[float] = []
    wall: list[float] = []
    floors: list[float] = []
    misaligned, body = 0, b""
    try:
        ask()  # the views thread is made on the first request
        at = _halfway(scraper, interval)
        deadline = time.monotonic() + 4 * requests * interval + 60
        while len(cpu) < requests:
            time.sleep(max(0.0, at - time.monotonic()))
            at += interval
            before = scraper.scrape().passes
            time.sleep(settle)
            thread_ns = _thread_cpu_ns(pid)
            began = time.perf_counter()
            body = ask()
            took = time.perf_counter() - began
            time.sleep(settle)
            used_ns = _thread_cpu_ns(pid) - thread_ns
            if scraper.scrape().passes == before:
                cpu.append(used_ns / 1e9)
                wall.append(took)
                if floor is not None:
                    floors.append(floor().cpu)
            else:
                misaligned += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path}: {len(cpu)} of {requests} requests between passes")
            if at < time.monotonic():  # fell behind (a slow request, a slow floor): realign
                at = _halfway(scraper, interval)
    finally:
        connection.close()
    listed = len(json.loads(body)["processes"])
    return ViewCost(query, cpu, wall, floors, listed, len(body), misaligned)


# The switches whose page the bench weighs: the default, then each turned the other way
SWITCHES: tuple[str, ...] = (
    "--no-export.interval-gauges",
    "--no-export.totals",
    "--no-collector.cgroup",
    "--no-collector.cgroup.pressure",
    "--per-container",
)


@dataclass
class PageSize:
    """What one page of `procdelta serve` ships for the pods of a table."""

    switch: str  # "default", or the one switch turned
    pods: int
    series: int  # sample lines carrying the uid of one of the table's pods
    line_bytes: int  # their bytes, newlines included
    page_bytes: int  # the whole page, uncompressed
    shipped_bytes: int  # the whole page as sent (gzip)
    per_group: Counter[int] = field(default_factory=Counter)  # series of a group -> groups
    failed: str | None = None  # why there is no page (serve refused the switch, or stopped)

    @property
    def groups(self) -> int:
        return sum(self.per_group.values())


_UID = re.compile(rb'[{,]uid="([^"]*)"')


def page_size(page: Page, switch: str, uids: set[str]) -> PageSize:
    """Series and bytes of the pods whose uid is in `uids` (another pod on the node, or the
    node's own groups, not counted); a group is one label set."""
    groups: Counter[bytes] = Counter()
    series = line_bytes = 0
    wanted = {uid.encode() for uid in uids}
    for line in page.text.split(b"\n"):
        found = _UID.search(line)
        if found is None or line.startswith(b"#") or found[1] not in wanted:
            continue
        series += 1
        line_bytes += len(line) + 1
        groups[line[line.index(b"{") : line.rindex(b"}") + 1]] += 1
    return PageSize(
        switch, len(uids), series, line_bytes, len(page.text), page.shipped,
        Counter(groups.values()),
    )  # fmt: skip


def page_sizes(
    pods_file: str, switches: Sequence[str] = SWITCHES, passes: int = SERVED_WARMUP
) -> list[PageSize]:
    """The page of a real `procdelta serve` over the pods of `pods_file` (named as kubelet
    names them: `pod_names`), as Prometheus fetches it, once `passes` passes completed
    (every shape of series is there from the second): with the default switches, then with
    each of `switches` turned."""
    uids = {uid for uid, _ in _pod_ids(pods_file)}
    sizes = []
    with pod_names(pods_file) as (pod_logs, container_logs):
        names = ["--path.pod-logs", pod_logs, "--path.container-logs", container_logs]
        for switch in ("default", *switches):
            try:
                with served([*names, *([] if switch == "default" else [switch])]) as (_, scraper):
                    sizes.append(page_size(_until_passes(scraper, passes), switch, uids))
            except (RuntimeError, OSError, http.client.HTTPException) as error:
                sizes.append(PageSize(switch, len(uids), 0, 0, 0, 0, failed=str(error)))
    return sizes


@dataclass
class TableResult:
    name: str
    processes: int
    threads: int
    procdelta: Sample
    naive: Sample
    ratios: list[float]  # procdelta's CPU over the floor's, round by round
    exporter_cpu: float | None
    exporter_failed: str | None = None  # why the exporter's scrapes were given up
    served: Served | None = None  # a served row: procdelta serve's whole CPU per pass
    served_failed: str | None = None  # a served row without a measure: why
    view: ViewCost | None = None  # a view row: requests of /processes to the served process

    @property
    def ratio(self) -> float:
        """A pass row: the median of the rounds' ratios. A served row: the whole span's CPU
        per pass over the floor (a garbage collection now and then counts, as on a node);
        `naive` is then the floor measured in the served span."""
        if self.served_failed is not None:
            return math.nan
        if self.served is not None:
            return self.served.cpu_per_pass / self.naive.cpu
        return statistics.median(self.ratios)


def bench_table(
    name: str,
    processes: int,
    mode: str,
    rounds: int,
    pause: float,
    pods: int = 0,
    variants: tuple[tuple[str, Options], ...] | None = None,
    served_passes: int = 0,
    then: Callable[[str | None], None] | None = None,
) -> list[TableResult]:
    """One synthetic table; each variant's pass and the floor measured in every round (in
    a rotating order), so that variants are compared with the same floor. One result per
    variant (by default one: procdelta with its default options). Each variant, and the
    floor, runs in a process of its own (`_pass_worker`). With `served_passes`, after the
    rounds, over the same table: a row for a real `procdelta serve` (`measure_served`, its
    pods named by `pod_names`), against the same floor. Then `then`, given the table's pods
    file (None without pods), while the table still runs."""
    variants = variants or ((name, DEFAULT_OPTIONS),)
    with (
        pid_room(processes * 3),  # 10% of processes with 20 threads: ~2.9 tasks each
        pod_cgroups(pods) as pods_file,
        synthetic_table(processes, mode, pods_file=pods_file),
        process_exporter() as exporter,
        _measured_apart([options for _, options in variants] + [None]) as parties,
    ):
        engines, floor_pass = parties[:-1], parties[-1]
        for _ in range(2):  # warm: the cache holds the table, as in a running collector
            for run_pass in engines:
                run_pass()
            time.sleep(pause)
        ours: list[list[Sample]] = [[] for _ in engines]
        naive: list[Sample] = []
        exporter_cpu: list[float] = []
        exporter_failed: str | None = None
        seen = (0, 0)
        for round_ in range(rounds):
            time.sleep(pause)
            steps: list[Callable[[], None]] = [
                (lambda run_pass=run_pass, out=out: out.append(run_pass()))
                for run_pass, out in zip(engines, ours, strict=True)
            ]
            steps.append(lambda: naive.append(floor_pass()))
            shift = round_ % len(steps)
            for step in steps[shift:] + steps[:shift]:
                step()
            if exporter is not None and exporter_failed is None:
                try:
                    before = _thread_cpu_ns(exporter[0])
                    _scrape(exporter[1])
                    exporter_cpu.append((_thread_cpu_ns(exporter[0]) - before) / 1e9)
                except OSError as error:  # refused, reset, timed out, gone: it did not keep up
                    exporter_failed = f"{type(error).__name__} in round {round_ + 1}"
            seen = naive_pass()
        floor = Sample(
            statistics.median(s.cpu for s in naive), statistics.median(s.wall for s in naive)
        )
        whole: list[TableResult] = []
        if served_passes:
            whole = _served_rows(name, pods_file, served_passes, seen, floor, floor_pass)
        if then is not None:
            then(pods_file)
    return [
        TableResult(
            label,
            seen[0],
            seen[1],
            Sample(
                statistics.median(s.cpu for s in samples),
                statistics.median(s.wall for s in samples),
            ),
            floor,
            [a.cpu / b.cpu for a, b in zip(samples, naive, strict=True)],
            None if exporter_failed else statistics.median(exporter_cpu) if exporter_cpu else None,
            exporter_failed,
        )
        for (label, _), samples in zip(variants, ours, strict=True)
    ] + whole


def _served_rows(
    name: str,
    pods_file: str | None,
    passes: int,
    seen: tuple[int, int],
    floor: Sample,
    floor_pass: Callable[[], Sample] | None = None,
    queries: Sequence[tuple[str, str]] = VIEW_QUERIES,
    requests: int = VIEW_REQUESTS,
) -> list[TableResult]:
    """The served row, then a view row for each of `queries` (`measure_view`, the same
    served process after its measured passes). Each row's floor is `floor_pass`'s passes
    in its own span (`floor`, the rounds' floor, where there is none: the machine's pace
    drifts between spans). A serve that fails is one row saying why."""
    failures = (RuntimeError, OSError, http.client.HTTPException, ValueError, KeyError)

    def failed(label: str, error: Exception) -> TableResult:  # said, not raised
        why = f"{type(error).__name__}: {error}"
        nothing = Sample(math.nan, math.nan)
        return TableResult(label, seen[0], seen[1], nothing, floor, [], None, served_failed=why)

    label = f"{name} served"
    views: list[TableResult] = []
    try:
        with contextlib.ExitStack() as stack:
            args: list[str] = []
            if pods_file is not None:
                pod_logs, container_logs = stack.enter_context(pod_names(pods_file))
                args = ["--path.pod-logs", pod_logs, "--path.container-logs", container_logs]
            pid, scraper = stack.enter_context(served(args))
            whole = measure_served(pid, scraper, passes, floor=floor_pass)
            for row, query in queries:
                try:
                    view = measure_view(pid, scraper, query, requests, floor=floor_pass)
                except failures as error:
                    views.append(failed(f"{name} {row}", error))
                    continue
                views.append(_view_row(f"{name} {row}", seen, view, floor))
    except failures as error:
        return [failed(label, error)]
    if whole.floor:
        floor = Sample(statistics.median(whole.floor), math.nan)
    served_row = TableResult(
        label, seen[0], seen[1], Sample(whole.cpu_per_pass, math.nan), floor,
        [cpu / floor.cpu for cpu in whole.per_pass], None, None, whole,
    )  # fmt: skip
    return [served_row, *views]


def _view_row(label: str, seen: tuple[int, int], view: ViewCost, floor: Sample) -> TableResult:
    """A view row: the median request's CPU and latency; its ratios, request by request,
    to the floor's pass after it (`floor`, where none was run)."""
    floors = view.floor or [floor.cpu] * len(view.cpu)
    return TableResult(
        label, seen[0], seen[1],
        Sample(statistics.median(view.cpu), statistics.median(view.wall)),
        Sample(statistics.median(floors), math.nan),
        [cpu / f for cpu, f in zip(view.cpu, floors, strict=True)], None, view=view,
    )  # fmt: skip


def serve_idle_cpu(seconds: float = 20, interval: float = 60) -> float:
    """CPU (ms) per second of a real `procdelta serve` between passes, unscraped: its
    threads' wakeups (schedstat, to the ns), which a served row at a short interval
    spreads over few seconds per pass, while a node pays them every second."""
    with served(["--pods-only"], interval) as (pid, scraper):
        _until_passes(scraper, 1)
        scraper.close()  # no connection left open, no handler thread
        time.sleep(1)
        began, cpu = time.monotonic(), _thread_cpu_ns(pid)
        time.sleep(seconds)
        return (_thread_cpu_ns(pid) - cpu) / 1e6 / (time.monotonic() - began)


def serve_rss(processes: int, passes: int = 4) -> float:
    """RSS (MB) of a real `procdelta serve` after some passes over a synthetic table."""
    with pid_room(processes * 3), synthetic_table(processes, "idle"):
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "collector", "serve", "--interval", "0.5",
             "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "error"],
        )  # fmt: skip
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                with contextlib.suppress(OSError):
                    page = _scrape(port)
                    count = [
                        line
                        for line in page.split(b"\n")
                        if line.startswith(b"procdelta_passes_total")
                    ]
                    if count and int(count[0].split()[1]) >= passes:
                        break
                time.sleep(0.2)
            return psutil.Process(server.pid).memory_info().rss / 1e6
        finally:
            server.terminate()
            server.wait()


class SyntheticEngine:
    """An engine that reports `groups` pod groups every pass, for the /metrics latency test."""

    def __init__(self, groups: int):
        self.groups = [
            Group("pod", (("namespace", f"ns{i % 20}"), ("pod", f"pod-{i}"),
                          ("uid", f"{i:08d}-0000-4000-8000-000000000000"), ("qos", "burstable")))
            for i in range(groups)
        ]  # fmt: skip
        self.passes = 0

    def run_pass(self) -> PassResult:
        self.passes += 1
        fields = Fields(**{name: 10**9 + self.passes for name in FIELD_NAMES})
        totals = {g: dict.fromkeys(COUNTER_FIELD_NAMES, 10**12 + self.passes) for g in self.groups}
        return PassResult(
            number=self.passes, listed_at_ns=0, interval_ns=10**9, duration_seconds=0.01,
            finished_at=time.time(), intervals=MappingProxyType(dict.fromkeys(self.groups, fields)),
            footprints=MappingProxyType({}), totals=MappingProxyType(totals),
            dropped=MappingProxyType({}), dropped_threads=MappingProxyType({}), tracked_processes=0,
            tracked_threads=0, denied=0,
        )  # fmt: skip


def metrics_latency(groups: int = 1000, scrapes: int = 300, interval: float = 0.25) -> list[float]:
    """Latency (ms) of scrapes of /metrics with `groups` groups while passes run."""
    import threading

    from collector.exporter import PassLoop, make_server

    sys.setswitchinterval(0.001)  # as `procdelta serve` sets it
    loop = PassLoop(SyntheticEngine(groups), interval)
    loop.run_pass()
    server = make_server("127.0.0.1:0", loop, "/metrics")
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    loop.start()
    port = server.server_address[1]
    latencies = []
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(scrapes):
            began = time.perf_counter()
            connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            connection.getresponse().read()
            latencies.append((time.perf_counter() - began) * 1000)
        connection.close()
    finally:
        loop.stop()
        server.shutdown()
        server.server_close()
    return latencies


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


DEFAULT_OPTIONS = Options("/proc", "/var/log/pods", "/var/log/containers", False, False)


def _variants(name: str, without_cgroups: bool) -> tuple[tuple[str, Options], ...]:
    """procdelta as it runs (`skip`: the cgroup fields, and the processes of a quiet
    cgroup carried unread), without that shortcut (`no-skip`), where asked without the
    cgroup fields at all (`no-cg`), and without the K-pass bound (`unbound`, no whole
    reads: what the bound costs): the same table, the same rounds."""
    options = DEFAULT_OPTIONS
    variants = [(f"{name} skip", options), (f"{name} no-skip", replace(options, skip_quiet=False))]
    if without_cgroups:
        variants.append((f"{name} no-cg", replace(options, cgroup=False)))
    variants.append(_unbound(name))
    return tuple(variants)


def _unbound(name: str) -> tuple[str, Options]:
    """procdelta without the K-pass bound's whole reads: what the bound costs."""
    return f"{name} unbound", replace(DEFAULT_OPTIONS, whole_read_passes=None)


def run(
    rounds: int,
    pause: float,
    quick: bool,
    echo: Callable[[str], None],
    output: str | None = None,
) -> None:
    """Every table, echoed line by line; with `output`, the report is also written there
    as Markdown (the machine, the command, the table), the one place it is kept."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        echo(line)

    _run(rounds, pause, quick, say)
    if output is not None:
        with open(output, "w") as out:
            out.write(report(lines, rounds, pause, quick))


def report(lines: list[str], rounds: int, pause: float, quick: bool) -> str:
    """The bench's output as a Markdown page: when, on what, by which command."""
    uname = os.uname()
    command = f"procdelta bench --rounds {rounds} --pause {pause:g}" + (" --quick" if quick else "")
    return (
        "# procdelta bench: the latest recorded run\n\n"
        f"Written by `{command} --output docs/bench.md` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: Linux {uname.release}, "
        f"{os.cpu_count()} CPUs, pid_max {int(_read(PID_MAX))}. [performance.md](performance.md) "
        "explains the tables; read the ratios (each round's pass over the "
        "same round's floor), not the absolute times.\n\n```\n" + "\n".join(lines) + "\n```\n"
    )


class Table(NamedTuple):
    """A synthetic table of the bench: a pods table spreads the processes over pod cgroups
    laid out as kubelet does (in every hierarchy); `mixed:10` runs the processes of 10 of
    them and leaves the others idle. `served`: a row for the served process too; `sizes`:
    weigh the page over it, for each switch."""

    name: str
    processes: int
    mode: str
    pods: int = 0
    variants: tuple[tuple[str, Options], ...] | None = None
    served: bool = False
    sizes: bool = False


def tables(quick: bool) -> list[Table]:
    if quick:
        return [
            Table("default N=200", 200, "idle"),
            Table("busy N=200", 200, "busy"),
            Table("pods N=200", 200, "idle", 22, _variants("pods N=200", True), True, True),
        ]
    return [
        Table(
            "default N=1000",
            1000,
            "idle",
            variants=(("default N=1000", DEFAULT_OPTIONS), _unbound("default N=1000")),
            served=True,
        ),
        Table("busy N=1000", 1000, "busy"),
        Table("pods N=1000", 1000, "idle", 110, _variants("pods N=1000", True), True, True),
        Table("pods10 N=1000", 1000, "mixed:10", 110, _variants("pods10 N=1000", False), True),
        # (no busy N=5000: 14.5k threads waking every 100 ms saturate a small machine,
        # and a pass would measure the run queue, not itself)
        Table("default N=5000", 5000, "idle"),
        Table("pods10 N=5000", 5000, "mixed:10", 110, _variants("pods10 N=5000", False)),
        Table("default N=200", 200, "idle"),
        Table("busy N=200", 200, "busy"),
    ]


def _run(rounds: int, pause: float, quick: bool, echo: Callable[[str], None]) -> None:
    echo(f"{rounds} interleaved rounds per table, medians; 10% of processes have 20 threads.")
    echo("cpu = user+system CPU of one pass; ratios are to the naive floor (b) of the same run.")
    echo("ratio: median of the rounds' ratios (each round's pass over the same round's floor);")
    echo("spread: their middle half (25th to 75th percentile). Each pass, and the floor, runs")
    echo("in a process of its own, as a collector does (no party scans another's objects).")
    echo("Tables named pods spread the processes over 110 pod cgroups (2 containers each);")
    echo("in pods10 the processes of 10 of them run. skip: as procdelta runs; no-skip: a")
    echo("quiet cgroup's processes read anyway; no-cg: no cgroup fields; unbound: no whole")
    echo("reads (K = infinity), to weigh what the K-pass bound costs. Same rounds.")
    for line in (
        f"served: what a node pays: a real `procdelta serve --interval {SERVED_INTERVAL:g}` in a",
        "process of its own over the same table after its rounds (a pods table's pods named",
        "as kubelet names them), scraped once a pass as Prometheus 3 scrapes (OpenMetrics,",
        "gzip), halfway between passes. cpu: the whole process's user+system CPU (every",
        "thread: the pass, building, rendering and compressing the page, GC, the scrapes)",
        f"over {SERVED_PASSES} passes after a warm-up of {SERVED_WARMUP}, divided by the passes "
        "its page counts",
        "in that span; naive: the floor's passes in that span (one after each scrape, in its",
        "own process: the machine's pace drifts between spans); ratio: cpu over naive;",
        "spread: the middle half of the pass-by-pass ratios (scrape to scrape). No wall",
        "time: a pass waits for its interval.",
        f"view: then {VIEW_REQUESTS} requests of /processes to the same served process "
        "(sorted by run",
        "delay, the first 20; view all: limit=0, every process), HTTP over 127.0.0.1 on a",
        "kept-alive connection, once a pass halfway between passes (one beside which a pass",
        "completed is left out). cpu: the serve process's CPU (every thread) for a request;",
        "wall: its latency at the client; naive: a floor pass after each request; ratio and",
        "spread: of the request-by-request ratios. Below the table: a request over the",
        "served row's CPU per pass.",
    ):
        echo(line)
    header = (
        f"{'table':<22} {'procs':>6} {'threads':>7} {'cpu ms':>8} {'wall ms':>8} "
        f"{'µs/proc':>8} {'µs/thr':>7} {'naive ms':>9} {'ratio':>6} {'spread':>10} "
        f"{'p-e ms':>8} {'p-e ratio':>9}"
    )
    echo(header)
    failures, notes, views = [], [], []
    shipped: list[tuple[str, list[PageSize]]] = []
    for table in tables(quick):
        served_cpu = math.nan  # the table's served row's CPU per pass, for its view rows

        def weigh(pods_file: str | None, name: str = table.name) -> None:
            assert pods_file is not None, "a table weighed has pods"
            shipped.append((name, page_sizes(pods_file)))

        for result in bench_table(
            table.name, table.processes, table.mode, rounds, pause, table.pods, table.variants,
            SERVED_PASSES if table.served else 0, weigh if table.sizes else None,
        ):  # fmt: skip
            _echo_row(result, echo)
            if result.served is not None:
                served_cpu = result.served.cpu_per_pass
            if result.view is not None:
                views.append(_view_note(result, served_cpu))
            if result.exporter_failed:
                failures.append(f"{result.name}: {result.exporter_failed}")
            if result.served_failed is not None:
                notes.append(f"{result.name}: no measure: {result.served_failed}")
            if result.served is not None and result.served.misaligned:
                notes.append(
                    f"{result.name}: {result.served.misaligned} scrape-to-scrape spans held no "
                    "pass or two (left out of the spread; the cpu per pass counts them all)"
                )
    for failure in failures:
        echo(f"prometheus-process-exporter could not keep up ({failure}): its scrapes stopped")
    for note in notes:
        echo(note)
    for view in views:
        echo(view)
    idle = serve_idle_cpu(10 if quick else 20)
    echo("")
    echo(f"procdelta serve between passes (none due, unscraped): {idle:.2f} ms of CPU per second;")
    echo(
        f"a pass carries {idle * 15:.1f} ms of it at the default --interval 15, "
        f"{idle * SERVED_INTERVAL:.1f} ms at {SERVED_INTERVAL:g} (the served rows)."
    )
    for name, sizes in shipped:
        _echo_sizes(name, sizes, echo)
    if not quick:
        for processes in (1000, 5000):
            rss = serve_rss(processes)
            echo(f"RSS of procdelta serve over the N={processes} table: {rss:.1f} MB")
    latencies = metrics_latency()
    echo(
        f"/metrics with 1000 groups while passes run: p50 {_percentile(latencies, 0.5):.2f} ms, "
        f"p99 {_percentile(latencies, 0.99):.2f} ms over {len(latencies)} scrapes"
    )


def _echo_row(result: TableResult, echo: Callable[[str], None]) -> None:
    ours, naive = result.procdelta, result.naive
    if result.served_failed is not None:
        echo(f"{result.name:<22} {result.processes:>6} {result.threads:>7} {'failed':>8} (below)")
        return
    spread = (
        f"{_percentile(result.ratios, 0.25):.2f}-{_percentile(result.ratios, 0.75):.2f}"
        if result.ratios
        else "-"
    )
    if result.exporter_failed:
        exporter = f"{'failed':>8} {'-':>9}"
    elif result.exporter_cpu is not None:
        exporter = f"{result.exporter_cpu * 1e3:8.1f} {result.exporter_cpu / naive.cpu:9.2f}"
    else:
        exporter = f"{'-':>8} {'-':>9}"
    wall = f"{'-':>8}" if math.isnan(ours.wall) else f"{ours.wall * 1e3:8.1f}"
    echo(
        f"{result.name:<22} {result.processes:>6} {result.threads:>7} {ours.cpu * 1e3:8.1f} "
        f"{wall} {ours.cpu * 1e6 / result.processes:8.1f} "
        f"{ours.cpu * 1e6 / result.threads:7.2f} {naive.cpu * 1e3:9.1f} "
        f"{result.ratio:6.2f} {spread:>10} {exporter}"
    )


def _view_note(result: TableResult, served_cpu: float) -> str:
    """A view row's request against its table's served pass: CPU, and what it answered."""
    view = result.view
    assert view is not None
    query = f"?{view.query}" if view.query else ""
    return (
        f"/processes{query} of {result.name}: {result.procdelta.cpu * 1e3:.1f} ms of CPU, "
        f"{result.procdelta.cpu / served_cpu:.2f} of a served pass ({served_cpu * 1e3:.1f} ms); "
        f"{view.listed} processes, {view.body_bytes / 1e3:.0f} kB of JSON"
        + (f"; {view.misaligned} beside a pass left out" if view.misaligned else "")
    )


def _echo_sizes(table: str, sizes: list[PageSize], echo: Callable[[str], None]) -> None:
    """What is shipped, per switch: series and bytes per pod (and per 110 pods, a node's
    default maximum), the label sets' series, the whole page plain and gzipped."""
    pods = sizes[0].pods
    echo("")
    echo(f"What is shipped: the page of procdelta serve over the {table} table ({pods} pods,")
    echo("named as kubelet names a Deployment's pods), fetched as Prometheus 3 fetches it")
    echo("(OpenMetrics, gzip), with the default switches and with each one turned. series, bytes:")
    echo("the sample lines carrying one of the table's pod uids (per pod, and for 110 pods);")
    echo("groups: their label sets (with --per-container, one per container); page: all of it.")
    echo(
        f"{'switches':<31} {'series/pod':>10} {'bytes/pod':>9} {'series/110':>10} "
        f"{'groups/pod':>10} {'series/group':>14} {'page bytes':>10} {'gzip bytes':>10}"
    )
    for size in sizes:
        if size.failed is not None:
            echo(f"{size.switch:<31} {'failed':>10} (below)")
            continue
        per_group = ",".join(str(n) for n in sorted(size.per_group, reverse=True))
        echo(
            f"{size.switch:<31} {size.series / size.pods:10.1f} "
            f"{size.line_bytes / size.pods:9.0f} {size.series * 110 / size.pods:10.0f} "
            f"{size.groups / size.pods:10.1f} {per_group:>14} {size.page_bytes:>10} "
            f"{size.shipped_bytes:>10}"
        )
    for size in sizes:
        if len(size.per_group) > 1:
            counts = ", ".join(
                f"{groups} of {series}" for series, groups in sorted(size.per_group.items())
            )
            echo(f"{size.switch}: groups of series: {counts} (a container holding no process,")
            echo("as the table's pause containers, exports its cgroup's fields only)")
        if size.failed is not None:
            echo(f"{size.switch}: no page: {size.failed}")
