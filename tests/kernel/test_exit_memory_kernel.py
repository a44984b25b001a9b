"""`serve --collector.exits` under the chart's memory limit (deploy/helm/procdelta/values.yaml),
in a real memory cgroup, beside a tenant churning 20,000 live threads and another storming
thread exits as fast as one unprivileged process can: never OOM-killed, its peak within
the limit. Needs root (cgroups, CAP_NET_ADMIN, setpriv, kernel.pid_max); fails without.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from collector.bench.tables import pid_room
from tests.cgroups import cgroup, enter, hierarchy
from tests.kernel.test_kernel import pod_layout
from tests.kernel.test_reliability import passes, scrape, value
from tests.net import free_port, wait_until

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]
SECONDS = max(45.0, float(os.environ.get("PROCDELTA_STORM_SECONDS", "60")))
LIVE = 20_000

# Keeps argv[1] threads alive for argv[2] seconds, each a bare pthread sleeping 1 to 4 s
# (libc's `sleep` its start routine, its seconds the argument; a 64 KiB stack), each gone
# replaced: ~LIVE / 2.5 exits a second. Prints `ready` once they are all up, then how many
# it made when its time is up.
CHURN = """
import ctypes, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
create = libc.pthread_create
create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
detach = libc.pthread_detach
detach.argtypes = [ctypes.c_ulong]
attr = ctypes.create_string_buffer(64)
libc.pthread_attr_init(attr)
libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(65536))
start = ctypes.cast(libc.sleep, ctypes.c_void_p)
thread = ctypes.c_ulong()
live, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
made, ready = 0, False

def threads():
    with open("/proc/self/status") as status:
        return int(next(l for l in status if l.startswith("Threads:")).split()[1])

while time.monotonic() < end:
    for _ in range(live - threads()):
        if create(ctypes.byref(thread), attr, start, ctypes.c_void_p(random.randint(1, 4))):
            break
        detach(thread.value)
        made += 1
    if not ready and threads() >= live:
        print("ready", flush=True)
        ready = True
    time.sleep(0.05)
print(made, flush=True)
"""


def chart_memory_limit() -> int:
    """Bytes: the chart's default memory limit (`resources.limits.memory`, in Mi)."""
    values = (ROOT / "deploy" / "helm" / "procdelta" / "values.yaml").read_text()
    found = re.search(r"limits:\s*\n\s*memory:\s*(\d+)Mi", values)
    assert found, "no memory limit in the chart's values"
    return int(found[1]) << 20


def test_exits_hold_within_the_charts_memory_limit_under_thread_churn_and_a_storm(tmp_path):
    limit = chart_memory_limit()
    hierarchy("memory")  # a v1 memory controller: fails here where none is mounted
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    kind, tenant_path = pod_layout("systemd-v2", uid, cid)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    port = free_port()
    workers: list[subprocess.Popen] = []
    with (
        pid_room(2 * LIVE),
        cgroup("memory", f"procdelta-test-{uuid.uuid4().hex[:8]}") as held,
        cgroup(kind, tenant_path) as tenant,
    ):
        Path(held, "memory.limit_in_bytes").write_text(str(limit))
        serve = subprocess.Popen(
            ["sh", "-c", f'{enter(held)} && exec "$@"', "sh", sys.executable, "-m",
             "collector", "serve", "--collector.exits", "--interval", "15",
             "--web.listen-address", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: passes(port) >= 1, 60, "a first pass")
            churn = subprocess.Popen(
                ["sh", "-c", f'{enter(tenant)} && exec "$@"', "sh", *nobody, sys.executable,
                 "-c", CHURN, str(LIVE), str(SECONDS)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            workers.append(churn)
            assert churn.stdout.readline().strip() == "ready", "the churn did not start"
            storm = subprocess.Popen(
                ["sh", "-c", f'{enter(tenant)} && exec "$@"', "sh", *nobody, sys.executable,
                 "-m", "collector.storm", "1000000", "0"],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            workers.append(storm)
            assert storm.stdout.readline().strip() == "ready", "the storm did not start"
            began = time.monotonic()
            first = passes(port)
            while churn.poll() is None and serve.poll() is None:
                time.sleep(1)
            alive = serve.poll() is None
            made = int(churn.stdout.readline() or 0) if churn.poll() is not None else 0
            seen = passes(port) - first if alive else 0
            last = scrape(port) if alive else {}
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
            if serve.poll() is None:
                serve.terminate()
            serve.wait(timeout=10)
        peak = int(Path(held, "memory.max_usage_in_bytes").read_text())
        oom = Path(held, "memory.oom_control").read_text()
    elapsed = time.monotonic() - began
    records = sum(v for (n, _), v in last.items() if n == "procdelta_exit_records_total")
    print(
        f"\nchurn: {LIVE} live threads, {made / elapsed:.0f} made a second, and a storm, for "
        f"{elapsed:.0f} s; serve {'alive' if alive else 'gone'} after {seen:.0f} passes, "
        f"{records:.0f} records; its cgroup's peak {peak / 2**20:.1f} MiB of "
        f"{limit / 2**20:.0f} MiB; {oom.split()}"
    )
    assert alive, f"serve died: {serve.stderr.read() if serve.stderr else ''}"
    assert made / elapsed > 2_000  # the threads churned
    assert seen >= 2 and records > 0
    assert peak < limit
    assert value(last, "procdelta_failed_passes_total") == 0
    assert "oom_kill 0" in oom
