"""A real `procdelta serve` in a process of its own, scraped as Prometheus scrapes it.

`serve_process` starts one and yields a `Scraper` (Prometheus 3's headers, one kept-alive
connection); `until_passes` and `halfway` find where its passes are; `serve_idle_cpu`
weighs what it spends between them.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from collector.bench.floor import thread_cpu_ns
from collector.bench.loopback import free_port

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
def serve_process(
    args: Sequence[str] = (), interval: float = SERVED_INTERVAL, timeout: float = 60
) -> Iterator[tuple[int, Scraper]]:
    """A real `procdelta serve` (`python -m collector serve`) with `args`, in a process of its
    own; yields its PID and a `Scraper` once /metrics answers. Stopped and reaped after."""
    port = free_port()
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


def until_passes(scraper: Scraper, passes: int, timeout: float = 60, poll: float = 0.1) -> Page:
    """The first page that counts `passes` completed passes."""
    deadline = time.monotonic() + timeout
    while True:
        page = scraper.scrape()
        if page.passes >= passes:
            return page
        if time.monotonic() > deadline:
            raise RuntimeError(f"procdelta serve completed {page.passes} of {passes} passes")
        time.sleep(poll)


def halfway(scraper: Scraper, interval: float) -> float:
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


def serve_idle_cpu(seconds: float = 20, interval: float = 60) -> float:
    """CPU (ms) per second of a real `procdelta serve` between passes, unscraped: its
    threads' wakeups (schedstat, to the ns), which a served row at a short interval
    spreads over few seconds per pass, while a node pays them every second."""
    with serve_process(["--pods-only"], interval) as (pid, scraper):
        until_passes(scraper, 1)
        scraper.close()  # no connection left open, no handler thread
        time.sleep(1)
        began, cpu = time.monotonic(), thread_cpu_ns(pid)
        time.sleep(seconds)
        return (thread_cpu_ns(pid) - cpu) / 1e6 / (time.monotonic() - began)
