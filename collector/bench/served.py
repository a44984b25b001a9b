"""What a running `procdelta serve` costs: its whole CPU per pass (`measure_served`),
and what a request of its processes view costs it (`measure_view`), each against a pass
of the floor run beside it.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from collector.bench.floor import Sample, thread_cpu_ns
from collector.bench.serve import (
    SERVED_INTERVAL,
    SERVED_PASSES,
    SERVED_WARMUP,
    Page,
    Scraper,
    halfway,
    until_passes,
)


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
    ends: Callable[[Page], None] | None = None,
) -> Served:
    """Scrape once a pass, halfway between two passes (a pass starts every `interval`: the
    phase is found from the moment the page's pass count moves), so that the span from the
    first scrape to the last holds whole passes only, and as many scrapes as passes. The CPU
    is the process's own (psutil: every thread, living or gone), read right after the first
    and the last scrape; the passes are the page's `procdelta_passes_total`. Each
    scrape-to-scrape span's CPU (the threads' schedstat, to the ns) gives the spread.
    With `floor`, one pass of the floor (in its own process) right after each scrape,
    halfway between two passes of the served process: the floor of the same span, as a
    pass row's floor is measured in the same rounds as its passes. With `ends`, called with
    the span's first page and its last, each right after the CPU is read: what else the
    span is to be read against (exitcost.py)."""
    process = psutil.Process(pid)
    until_passes(scraper, warmup, poll=interval / 5)
    at = halfway(scraper, interval)
    time.sleep(max(0.0, at - time.monotonic()))
    page = scraper.scrape()
    first = last = page.passes
    cpu = sum(process.cpu_times()[:2])
    if ends is not None:
        ends(page)
    thread_ns = thread_cpu_ns(pid)
    per_pass: list[float] = []
    floors: list[float] = []
    misaligned = 0
    deadline = time.monotonic() + 4 * passes * interval + 60
    while last - first < passes:
        at += interval
        time.sleep(max(0.0, at - time.monotonic()))
        page = scraper.scrape()
        now, now_ns = page.passes, thread_cpu_ns(pid)
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
    if ends is not None:
        ends(page)
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
        at = halfway(scraper, interval)
        deadline = time.monotonic() + 4 * requests * interval + 60
        while len(cpu) < requests:
            time.sleep(max(0.0, at - time.monotonic()))
            at += interval
            before = scraper.scrape().passes
            time.sleep(settle)
            thread_ns = thread_cpu_ns(pid)
            began = time.perf_counter()
            body = ask()
            took = time.perf_counter() - began
            time.sleep(settle)
            used_ns = thread_cpu_ns(pid) - thread_ns
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
                at = halfway(scraper, interval)
    finally:
        connection.close()
    listed = len(json.loads(body)["processes"])
    return ViewCost(query, cpu, wall, floors, listed, len(body), misaligned)
