"""The peer the bench measures beside procdelta: Debian's prometheus-process-exporter.

Where it is installed, each table's rounds end with one scrape of it over the same table
(`scrape_cpu`: its CPU for that scrape, every thread); where it is not, its column is
empty and the report says why (`exporter_legend`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

from collector.bench.floor import thread_cpu_ns
from collector.bench.loopback import fetch, free_port

BINARY = "prometheus-process-exporter"


def exporter_legend() -> list[str]:
    """The report's words on the p-e columns: what they hold, or (one line) why they are
    empty."""
    if shutil.which(BINARY) is None:
        return [f"p-e: not measured: {BINARY} (a Debian package) is not installed."]
    return [
        f"p-e: {BINARY} (Debian's; every process by name), over the same table:",
        "its CPU (every thread) for a scrape after each round; p-e ratio: over the same floor.",
    ]


@contextlib.contextmanager
def process_exporter() -> Iterator[tuple[int, int] | None]:
    """Debian's prometheus-process-exporter, default options, every process by name."""
    binary = shutil.which(BINARY)
    if binary is None:
        yield None
        return
    directory = tempfile.mkdtemp(prefix="procdelta-bench-")
    config = os.path.join(directory, "config.yml")
    with open(config, "w") as out:
        out.write("process_names:\n  - name: '{{.Comm}}'\n    cmdline: ['.+']\n")
    port = free_port()
    exporter = subprocess.Popen(
        [binary, "-config.path", config, "-web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                fetch(port)
                break
            time.sleep(0.1)
        # one that never answered is measured anyway: its first scrape fails, and the
        # table says so (`failed`) instead of stopping the bench
        yield exporter.pid, port
    finally:
        exporter.kill()
        exporter.wait()
        shutil.rmtree(directory, ignore_errors=True)


def scrape_cpu(exporter: tuple[int, int]) -> float:
    """The CPU seconds (every thread's schedstat) a running exporter spends on one scrape."""
    pid, port = exporter
    before = thread_cpu_ns(pid)
    fetch(port)
    return (thread_cpu_ns(pid) - before) / 1e9
