"""Kernel truth for lineage (collector/lineage.py): tasks born and gone between two passes, in
a real kubelet-shaped pod cgroup, counted in the pod whatever their parents' lives — a
long-lived parent, a short-lived intermediate, orphans in a PID namespace of the pod's own,
a real `make -j2` of C files with Debian's gcc — each ≥ 0.95 of the CPU the pod's own
cgroup counted; and a parent's PID taken by another pod's process moves nothing into it.
Needs root (CAP_NET_ADMIN), the host's network and PID namespaces, a kernel with TASKSTATS,
and gcc and make (.ci/run installs them); fails without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from collector.cli import build_engine
from collector.engine import PassResult
from collector.exits import MAX_WAIT_SECONDS, ExitListener
from collector.model import Fields
from tests.cgroups import cgroup, enter
from tests.kernel.test_exits_kernel import close, outcomes_of, pod_sums
from tests.kernel.test_kernel import pod, pod_layout  # noqa: F401 (the fixture)

pytestmark = pytest.mark.kernel

PASS_SECONDS = 0.5
SECONDS = 6

# Lives of 30 ms of CPU each, one after the other for argv[2] seconds, made as argv[1] says:
# `direct`, children of this long-lived process; `intermediate`, each child of a process
# of its own that waits for it and exits (a short-lived parent); `orphans`, each left by
# its parent at once and reaped by this process, the init of the PID namespace it runs in.
LIVES = """
import os, sys, time

def burn():
    until = time.thread_time() + 0.03
    while time.thread_time() < until:
        pass
    os._exit(0)

mode, end = sys.argv[1], time.monotonic() + float(sys.argv[2])
n = 0
while time.monotonic() < end:
    first = os.fork()
    if first == 0:
        if mode == "direct":
            burn()
        second = os.fork()
        if second == 0:
            burn()
        if mode == "intermediate":
            os.waitpid(second, 0)
        os._exit(0)
    if mode == "orphans":
        while True:  # reap the parent and every orphan that ended meanwhile
            try:
                pid, _ = os.waitpid(-1, 0 if n == 0 else os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        time.sleep(0.031)  # the orphan's life, then the next
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
    else:
        os.waitpid(first, 0)
    n += 1
print(n, flush=True)
"""


def counted(made: dict, command: list[str], cwd: str | None = None) -> tuple[Fields, int, dict]:
    """Run `command` in the pod's cgroup beside passes every PASS_SECONDS, with exit records;
    (the pod's sums over the passes after the first, its cgroup's CPU over them, the records'
    outcomes)."""
    engine = build_engine(replace(made["options"], exits=True))
    results: list[PassResult] = []
    try:
        assert isinstance(engine.exits, ExitListener), "no exit records here"
        engine.run_pass()
        # The first pass is the baseline: a task begun less than a record may wait in the
        # socket (MAX_WAIT_SECONDS) after it began listing may be one it read, and its
        # record does not count it whole (docs/reference.md §2). The command starts well
        # after, as a node's processes do after procdelta's start.
        time.sleep(2 * MAX_WAIT_SECONDS)
        line = f'{enter(made["cgroup"])} && exec "$@"'
        work = subprocess.Popen(
            ["sh", "-c", line, "sh", *command],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            while work.poll() is None:
                time.sleep(PASS_SECONDS)
                results.append(engine.run_pass())
        finally:
            if work.poll() is None:
                work.kill()
            out, err = work.communicate(timeout=30)
        assert work.returncode == 0, err
        for _ in range(3):  # the last records, and those that waited one pass for a parent's
            time.sleep(PASS_SECONDS)
            results.append(engine.run_pass())
    finally:
        close(engine)
    summed, cgroup_ns = pod_sums(results, made["uid"])
    outcomes = outcomes_of(results)
    print(
        f"\n{' '.join(command[-3:])}: {out.strip()[-40:]!r} on-CPU in the sums "
        f"{summed.on_cpu_nanos / 1e9:.3f} s, the pod's cgroup {cgroup_ns / 1e9:.3f} s "
        f"({summed.on_cpu_nanos / max(cgroup_ns, 1):.3f}); records {outcomes}"
    )
    return summed, cgroup_ns, outcomes


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
@pytest.mark.parametrize("mode", ["direct", "intermediate"])
def test_short_lives_count_in_their_pod_through_short_lived_parents(pod, mode):  # noqa: F811
    summed, cgroup_ns, _ = counted(pod, [sys.executable, "-c", LIVES, mode, str(SECONDS)])
    assert cgroup_ns > 1e9  # the lives ran
    assert summed.on_cpu_nanos >= 0.95 * cgroup_ns
    assert summed.on_cpu_nanos <= cgroup_ns * 1.01 + 10**7  # never counted twice


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
def test_orphans_count_in_their_pod_where_it_has_its_own_pid_namespace(pod):  # noqa: F811
    """Each orphan's record names its reaper, the init of the pod's PID namespace (as a
    container's own init is, Kubernetes' default), which is in the pod."""
    command = ["unshare", "--pid", "--fork", "--kill-child",
               sys.executable, "-c", LIVES, "orphans", str(SECONDS)]  # fmt: skip
    summed, cgroup_ns, _ = counted(pod, command)
    assert cgroup_ns > 1e9
    assert summed.on_cpu_nanos >= 0.95 * cgroup_ns
    assert summed.on_cpu_nanos <= cgroup_ns * 1.01 + 10**7


SOURCE = """
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
%s
int main(void) { return 0; }
"""


def c_file(index: int) -> str:
    """A C file that takes cc1 some tens of ms: many small functions."""
    body = "\n".join(
        f"static int f{index}_{n}(int x) {{ int s = 0; for (int i = 0; i < x; i++) "
        f's += i * {n} ^ (s >> 3); return s + (int)strlen("{n}"); }}\n'
        f"int g{index}_{n}(int x) {{ return f{index}_{n}(x) + {n}; }}"
        for n in range(150)
    )
    return SOURCE % body


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
def test_a_make_j2_build_counts_in_its_pod(pod, tmp_path):  # noqa: F811
    """`make -j2` of 24 C files with gcc, again and again: make → gcc → cc1 and as, each
    gcc gone soon after its children."""
    assert shutil.which("gcc") and shutil.which("make"), "gcc and make are needed"
    build = Path(tmp_path) / "build"
    build.mkdir()
    objects = []
    for index in range(24):
        (build / f"u{index}.c").write_text(c_file(index))
        objects.append(f"u{index}.o")
    (build / "Makefile").write_text(f"all: {' '.join(objects)}\n%.o: %.c\n\tgcc -O1 -c $< -o $@\n")
    os.chmod(build, 0o777)
    loop = (
        f"end=$(( $(date +%s) + {SECONDS} )); "
        "while [ $(date +%s) -lt $end ]; do make -s -j2 -B >/dev/null || exit 1; done"
    )
    summed, cgroup_ns, _ = counted(pod, ["sh", "-c", loop], cwd=str(build))
    assert cgroup_ns > 1e9
    assert summed.on_cpu_nanos >= 0.95 * cgroup_ns
    assert summed.on_cpu_nanos <= cgroup_ns * 1.01 + 10**7


# The tenant: P forks C, C burns 1 s of CPU and exits, P waits for it and exits; the
# tenant prints P's PID and C's CPU, and waits for a line.
TENANT = """
import os, sys, time
time.sleep(0.5)  # begun well after the pass before (more than a record may wait)
r, w = os.pipe()
p = os.fork()
if p == 0:
    c = os.fork()
    if c == 0:
        until = time.thread_time() + 1.0
        while time.thread_time() < until:
            pass
        with open("/proc/self/schedstat") as stat:
            os.write(w, stat.read().split()[0].encode())
        os._exit(0)
    os.waitpid(c, 0)
    os._exit(0)
os.waitpid(p, 0)
os.close(w)
print(p, os.read(r, 64).decode(), flush=True)
sys.stdin.readline()
"""

# The victim: takes the PID argv[1] for a child of its own (ns_last_pid set below it
# before each fork), which sleeps until its parent's stdin closes.
VICTIM = """
import os, sys, time
wanted = int(sys.argv[1])
for _ in range(400):
    with open("/proc/sys/kernel/ns_last_pid", "w") as last:
        last.write(str(wanted - 1))
    child = os.fork()
    if child == 0:
        if os.getpid() == wanted:
            time.sleep(600)
        os._exit(0)
    if child == wanted:
        print("took", flush=True)
        sys.stdin.readline()
        os.kill(child, 9)
        os.waitpid(child, 0)
        break
    os.waitpid(child, 0)
else:
    print("missed", flush=True)
"""


def tenant_and_victim(logs: Path) -> dict[str, tuple[str, tuple]]:
    """Two pods, `tenant` and `victim` (each in a namespace of its name), named in kubelet's
    log directories below `logs`: by name, (uid, their systemd-v2 cgroup layout)."""
    pods = {}
    for name in ("tenant", "victim"):
        uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
        (logs / "pods" / f"ns-{name}_{name}_{uid}").mkdir(parents=True)
        (logs / "containers").mkdir(exist_ok=True)
        (logs / "containers" / f"{name}_ns-{name}_main-{cid}.log").touch()
        pods[name] = (uid, pod_layout("systemd-v2", uid, cid))
    return pods


def test_a_parents_pid_taken_by_another_pods_process_moves_nothing_into_that_pod(tmp_path):
    """A tenant's child burns 1 s under a parent that then exits; a process of a victim pod
    takes the parent's PID before the pass. The child is the tenant's: counted in the
    tenant's pod (its parent's record names the tenant), nothing of it in the victim's."""
    pods = tenant_and_victim(tmp_path)
    from collector.wiring import Options

    options = Options(procfs="/proc", pod_logs=str(tmp_path / "pods"),
                      container_logs=str(tmp_path / "containers"), per_container=True,
                      pods_only=True, exits=True)  # fmt: skip
    tenant_uid, (kind, tenant_path) = pods["tenant"]
    victim_uid, (_, victim_path) = pods["victim"]
    with cgroup(kind, tenant_path) as tenant_cgroup, cgroup(kind, victim_path) as victim_cgroup:
        engine = build_engine(options)
        workers = []
        try:
            assert isinstance(engine.exits, ExitListener), "no exit records here"
            engine.run_pass()
            for path, script, args in ((tenant_cgroup, TENANT, []),):
                workers.append(subprocess.Popen(
                    ["sh", "-c", f'{enter(path)} && exec "$@"', "sh", sys.executable, "-c",
                     script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                ))  # fmt: skip
            parent, burned = workers[0].stdout.readline().split()
            workers.append(subprocess.Popen(
                ["sh", "-c", f'{enter(victim_cgroup)} && exec "$@"', "sh", sys.executable,
                 "-c", VICTIM, parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            ))  # fmt: skip
            assert workers[1].stdout.readline().strip() == "took", f"PID {parent} not taken"
            time.sleep(PASS_SECONDS)
            results = [engine.run_pass()]
            time.sleep(PASS_SECONDS)
            results.append(engine.run_pass())
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
            close(engine)
    tenant, victim = Fields(), Fields()
    for result in results:
        for group, fields in result.intervals.items():
            uid = group.label_dict()["uid"]
            if uid in (tenant_uid, victim_uid):
                (tenant if uid == tenant_uid else victim).add(fields)
    print(f"\nchild burned {int(burned) / 1e9:.3f} s; tenant {tenant.on_cpu_nanos / 1e9:.3f} s, "
          f"victim {victim.on_cpu_nanos / 1e9:.3f} s")  # fmt: skip
    assert int(burned) >= 10**9
    assert victim.on_cpu_nanos < 0.1 * 10**9
    assert tenant.on_cpu_nanos >= int(burned)
