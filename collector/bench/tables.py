"""The synthetic process tables the bench measures, and what each needs on the machine.

`tables` lists them; `synthetic_table` runs one (collector/synthetic.py, a process of its
own); `pod_cgroups` lays out the pod cgroups a pods table spreads its processes over, as
kubelet does; `pod_names` names those pods as kubelet's log directories do; `pid_room`
makes room in the PID space for a big table.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

from collector.bench.floor import read_file
from collector.cgroupfs import detect
from collector.wiring import Options


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
        assert table.stdout is not None  # a PIPE
        if table.stdout.readline().strip() != "ready":
            raise RuntimeError("the synthetic table did not start")
        yield table
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(table.pid, signal.SIGKILL)
        table.wait()
        deadline = time.time() + 10
        while time.time() < deadline and task_count() > _BASELINE_TASKS + 50:
            time.sleep(0.1)


PID_MAX = "/proc/sys/kernel/pid_max"


@contextlib.contextmanager
def pid_room(tasks: int, path: str = PID_MAX) -> Iterator[None]:
    """Room in the PID space for `tasks` more tasks (every thread takes a PID): where
    `kernel.pid_max` is below twice what the table and the machine need, it is raised
    for the table's span and restored after (a 15k-thread table on a host left at
    32768 would otherwise fail to fork or wrap PIDs mid-measure)."""
    current = int(read_file(path))
    wanted = 2 * (tasks + task_count())
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


def task_count() -> int:
    return int(read_file("/proc/loadavg").split()[3].split(b"/")[1])


_BASELINE_TASKS = task_count()


def pod_ids(pods_file: str) -> list[tuple[str, str]]:
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
        for index, (uid, app) in enumerate(pod_ids(pods_file)):
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


DEFAULT_OPTIONS = Options()


def variants(name: str, without_cgroups: bool) -> tuple[tuple[str, Options], ...]:
    """procdelta as it runs (`skip`: the cgroup fields, and the processes of a quiet
    cgroup carried unread), without that shortcut (`no-skip`), where asked without the
    cgroup fields at all (`no-cg`), and without the K-pass bound (`unbound`, no whole
    reads: what the bound costs): the same table, the same rounds."""
    options = DEFAULT_OPTIONS
    found = [(f"{name} skip", options), (f"{name} no-skip", replace(options, carry_quiet=False))]
    if without_cgroups:
        found.append((f"{name} no-cg", replace(options, cgroup=False)))
    found.append(unbound(name))
    return tuple(found)


def unbound(name: str) -> tuple[str, Options]:
    """procdelta without the K-pass bound's whole reads: what the bound costs."""
    return f"{name} unbound", replace(DEFAULT_OPTIONS, whole_read_passes=None)


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
            Table("pods N=200", 200, "idle", 22, variants("pods N=200", True), True, True),
        ]
    return [
        Table(
            "default N=1000",
            1000,
            "idle",
            variants=(("default N=1000", DEFAULT_OPTIONS), unbound("default N=1000")),
            served=True,
        ),
        Table("busy N=1000", 1000, "busy"),
        Table("pods N=1000", 1000, "idle", 110, variants("pods N=1000", True), True, True),
        Table("pods10 N=1000", 1000, "mixed:10", 110, variants("pods10 N=1000", False), True),
        # (no busy N=5000: 14.5k threads waking every 100 ms saturate a small machine,
        # and a pass would measure the run queue, not itself)
        Table("default N=5000", 5000, "idle"),
        Table("pods10 N=5000", 5000, "mixed:10", 110, variants("pods10 N=5000", False)),
        Table("default N=200", 200, "idle"),
        Table("busy N=200", 200, "busy"),
    ]
