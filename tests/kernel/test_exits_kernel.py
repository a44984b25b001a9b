"""Kernel truth for the exit records (`--collector.exits`, collector/exits.py): short lives
in a real kubelet-shaped pod cgroup, the kernel's own records, the sums procdelta makes of
them. Needs root (CAP_NET_ADMIN), the host's network and PID namespaces and a kernel with
TASKSTATS; fails without them.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from dataclasses import replace

import pytest

from collector.cli import build_engine
from collector.closing import START_TOLERANCE_NS
from collector.engine import Engine, PassResult
from collector.exits import MAX_WAIT_SECONDS, ExitListener
from collector.model import Fields
from tests.kernel.test_kernel import pod, pod_interval  # noqa: F401 (the fixture)

pytestmark = pytest.mark.kernel

PASS_SECONDS = 0.5


def self_reported(path: str) -> tuple[int, int, int]:
    """(lives, Σ on-CPU, Σ run delay) the lives wrote of themselves as they ended."""
    with open(path) as report:
        lines = [line.split() for line in report if line.strip()]
    return len(lines), sum(int(a) for a, _ in lines), sum(int(b) for _, b in lines)


def pod_sums(results: list[PassResult], uid: str) -> tuple[Fields, int]:
    """The pod's intervals over these passes, summed, and its cgroup's CPU over them."""
    total, cgroup_ns = Fields(), 0
    for result in results:
        matches = [g for g in result.intervals if g.label_dict()["uid"] == uid]
        for group in matches:
            total.add(result.intervals[group])
            cgroup = result.cgroup_intervals.get(group)
            if cgroup is not None and cgroup.cgroup_cpu_nanos is not None:
                cgroup_ns += cgroup.cgroup_cpu_nanos
    return total, cgroup_ns


def outcomes_of(results: list[PassResult]) -> dict[str, int]:
    """The exit records' outcomes over these passes (procdelta_exit_records_total's)."""
    outcomes: dict[str, int] = {}
    for result in results:
        for outcome, count in (result.exits or {}).items():
            outcomes[outcome] = outcomes.get(outcome, 0) + count
    return outcomes


def close(engine: Engine) -> None:
    if engine.exits is not None:
        engine.exits.close()


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_short_lives_are_counted_whole(pod, kind, tmp_path):  # noqa: F811 (the fixture)
    """Three workers on one CPU, each starting 40 ms lives one after the other for 3 s
    (child processes, or threads of the pod's one long process): the sums of the passes
    after the first hold ≥ 0.97 of the on-CPU time and run delay the lives read of
    themselves just before they ended, and no more on-CPU time than the pod's cgroup
    counted. Beside them, the same passes without the records (a second engine over the
    same processes) miss most of it: the loss the records close."""
    from tests.cgroups import Workload

    report = str(tmp_path / "lives")
    options = pod["options"]
    with Workload(pod["cgroup"], "--cpu", "0") as work:
        listening = build_engine(replace(options, exits=True))
        plain = build_engine(options)
        try:
            assert isinstance(listening.exits, ExitListener), "no exit records here"
            listening.run_pass()
            plain.run_pass()
            # the first pass is the baseline: the lives begin well after it listed (a task
            # begun within a record's wait of that may be one it read: not counted whole)
            time.sleep(2 * MAX_WAIT_SECONDS)
            work.process.stdin.write(f"lives {kind} 3 40 {report} 3\n")
            work.process.stdin.flush()
            heard: list[PassResult] = []
            seen: list[PassResult] = []
            answer = ""
            while not answer:
                time.sleep(PASS_SECONDS)
                heard.append(listening.run_pass())
                seen.append(plain.run_pass())
                ready, _, _ = select.select([work.process.stdout], [], [], 0)
                if ready:
                    answer = work.process.stdout.readline().strip()
                    assert answer.startswith("lived "), answer
            time.sleep(PASS_SECONDS)  # the last records reach the listener
            heard.append(listening.run_pass())
            seen.append(plain.run_pass())
        finally:
            close(listening)
    lives, on_cpu, delay = self_reported(report)
    summed, cgroup_ns = pod_sums(heard, pod["uid"])
    without, _ = pod_sums(seen, pod["uid"])
    outcomes = outcomes_of(heard)
    print(
        f"\n{kind}: {lives} lives reported on-CPU {on_cpu / 1e9:.3f} s, run delay "
        f"{delay / 1e9:.3f} s; with the records {summed.on_cpu_nanos / 1e9:.3f} s "
        f"({summed.on_cpu_nanos / on_cpu:.3f}), {summed.run_delay_nanos / 1e9:.3f} s "
        f"({summed.run_delay_nanos / delay:.3f}); without {without.on_cpu_nanos / 1e9:.3f} s "
        f"({without.on_cpu_nanos / on_cpu:.3f}), {without.run_delay_nanos / 1e9:.3f} s "
        f"({without.run_delay_nanos / delay:.3f}); the pod's cgroup {cgroup_ns / 1e9:.3f} s; "
        f"records {outcomes}"
    )
    assert lives >= int(answer.split()[1]) > 30  # every life reported; 40 ms each, 3 s
    assert delay > 0.5e9  # three workers on one CPU waited for it
    assert summed.on_cpu_nanos >= 0.97 * on_cpu
    assert summed.run_delay_nanos >= 0.97 * delay
    # Not counted twice: never more than the cgroup ran (its usage is in µs on v2: one
    # rounding per pass at most).
    assert summed.on_cpu_nanos <= cgroup_ns + 1000 * len(heard)
    assert without.on_cpu_nanos < 0.5 * on_cpu  # what the records closed
    # every life's record came to an end that counts it (the node's other exits are in
    # these counts too: some may be unplaced); `read`: a pass read its zombie, and counted
    # its last interval then
    taken = ("born", "closed", "read")
    assert sum(outcomes.get(outcome, 0) for outcome in taken) >= lives, outcomes


# A process in the pod that takes a given PID for a child of its own (the kernel's
# ns_last_pid set below it before each fork; another fork on the machine may take it
# first, so it tries again), which runs 50 ms of CPU, reports its schedstat and exits;
# the process then waits for a line on stdin, so that the child's parent can be read.
TAKE_PID = """
import hashlib, os, sys, time
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
wanted = int(sys.argv[2])
for _ in range(200):
    with open("/proc/sys/kernel/ns_last_pid", "w") as last:
        last.write(str(wanted - 1))
    child = os.fork()
    if child == 0:
        if os.getpid() == wanted:
            until = time.thread_time() + 0.05
            while time.thread_time() < until:
                hashlib.sha256(b"x" * 65536).digest()
            with open(f"/proc/self/schedstat") as stat:
                print(stat.read().split()[0], flush=True)
        os._exit(0)
    os.waitpid(child, 0)
    if child == wanted:
        break
else:
    print("missed", flush=True)
sys.stdin.readline()
"""


def captured(engine: Engine) -> list:
    """The outcome of each `Tracker.close` the engine's passes make, from now on."""
    closes = []
    close_records = engine.tracker.close

    def keeping(records, sink=None, **given):
        closed = close_records(records, **given)  # the deltas kept, then given to the sink
        closes.append(closed)
        for delta in closed.deltas if sink is not None else ():
            sink(delta)
        return closed

    engine.tracker.close = keeping
    return closes


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
def test_a_reused_pid_is_another_task(pod):  # noqa: F811 (the fixture)
    """A process of the pod read by two passes is killed; before the next pass, a new
    process takes its PID (a child of another process of the pod), runs 50 ms and exits.
    The next pass closes the first against its reading (or leaves it, where its wait spans
    that read) and counts the second whole, in the pod: neither record is taken for the
    other's. The new process starts more than
    START_TOLERANCE_NS after the first: a PID taken again sooner than that is told apart
    by the counters alone (docs/reference.md §2)."""
    import sys

    cgroup_procs = os.path.join(pod["cgroup"], "cgroup.procs")
    engine = build_engine(replace(pod["options"], exits=True))
    parent = None
    try:
        assert isinstance(engine.exits, ExitListener), "no exit records here"
        first = subprocess.Popen(["sh", "-c", f'echo $$ > "{cgroup_procs}"; exec sleep 60'])
        time.sleep(0.2)
        engine.run_pass()
        time.sleep(START_TOLERANCE_NS / 1e9 + 0.5)
        engine.run_pass()
        with open(f"/proc/{first.pid}/stat") as stat:
            first_start = int(stat.read().rsplit(")", 1)[1].split()[19])
        closes = captured(engine)
        first.kill()
        first.wait()
        parent = subprocess.Popen(
            [sys.executable, "-c", TAKE_PID, cgroup_procs, str(first.pid)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        reported = parent.stdout.readline().strip()
        assert reported.isdigit(), f"PID {first.pid} not taken again: {reported}"
        time.sleep(PASS_SECONDS)
        result = engine.run_pass()
    finally:
        if parent is not None:
            parent.kill()
            parent.wait()
        close(engine)
    ours = (os.getpid(), parent.pid)  # the parents of the two: not another task of that TID
    deltas = [
        d
        for closed in closes
        for d in closed.deltas
        if d.record.pid == d.record.tgid == first.pid and d.record.ppid in ours
    ]
    print(f"\nPID {first.pid} twice: {[(d.process is not None, d.fields) for d in deltas]}")
    # The first, killed asleep right after the pass read it, moved no counter since: its
    # record closes its interval against that reading, or, where it may have come after
    # an exit the pass read (its wait spans the read), nothing (`read`). Never a birth.
    assert 1 <= len(deltas) <= 2, deltas
    *held, born = sorted(deltas, key=lambda d: d.process is None)
    assert len(held) <= 1 and all(d.process is not None for d in held), deltas
    for first_record in held:
        assert first_record.process.start_ticks == first_start
        assert first_record.fields.on_cpu_nanos < 10**7  # a sleep's last interval
    assert born.process is None and born.fields.processes == 1
    assert born.fields.on_cpu_nanos == born.record.on_cpu_ns >= int(reported)
    _, fields = pod_interval(result, pod["uid"])
    assert fields.on_cpu_nanos >= born.record.on_cpu_ns
    assert fields.processes >= 1 + len(held)


STORM_SECONDS = float(os.environ.get("PROCDELTA_STORM_SECONDS", "60"))

# Two storms in the pod: a process forking children that exit at once, and one starting
# threads that do; each prints how many it made when its time is up.
FORKS = (
    "my $end = time + $ARGV[0]; my $n = 0; while (time < $end) { my $p = fork; "
    'if (!$p) { exit 0 } waitpid($p, 0); $n++ } print "$n\\n";'
)
THREADS = """
import sys, threading, time
end, n = time.monotonic() + float(sys.argv[1]), 0
while time.monotonic() < end:
    thread = threading.Thread(target=int)
    thread.start()
    thread.join()
    n += 1
print(n, flush=True)
"""


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
def test_a_fork_storm_loses_no_record_at_the_default_buffer(pod, capsys):  # noqa: F811
    """Children forked and threads started as fast as the node allows, ≥ 5,000 exits a
    second for PROCDELTA_STORM_SECONDS (60 by default), while passes run every second in
    the same process: every exit's record reaches a pass (counted by parent and process
    against what the storms made), none dropped, the buffer never overflowed."""
    import sys

    from tests.cgroups import enter

    engine = build_engine(replace(pod["options"], exits=True))
    storms = []
    try:
        listener = engine.exits
        assert isinstance(listener, ExitListener), "no exit records here"
        engine.run_pass()
        seconds = str(STORM_SECONDS)
        in_pod = ["sh", "-c", f'{enter(pod["cgroup"])} && exec "$@"', "-"]
        commands = (["perl", "-e", FORKS, seconds], [sys.executable, "-c", THREADS, seconds])
        storms = [
            subprocess.Popen([*in_pod, *command], stdout=subprocess.PIPE, text=True)
            for command in commands
        ]
        forker, threader = (storm.pid for storm in storms)
        heard = {"forks": 0, "threads": 0}
        take = listener.take

        def counting():  # the records a pass takes, and the threads folded as they came
            records, folds = take()
            for record in records:
                if record.ppid == forker and record.pid == record.tgid:
                    heard["forks"] += 1
                elif record.tgid == threader and record.pid != threader:
                    heard["threads"] += 1
            heard["threads"] += sum(fold.tasks for fold in folds if fold.tgid == threader)
            return records, folds

        listener.take = counting  # type: ignore[method-assign]
        began = time.monotonic()
        passes = 0
        while any(storm.poll() is None for storm in storms):
            time.sleep(1.0)
            engine.run_pass()
            passes += 1
        elapsed = time.monotonic() - began
        made = [int(storm.stdout.read().split()[0]) for storm in storms]
        time.sleep(1.0)
        engine.run_pass()
    finally:
        for storm in storms:
            if storm.poll() is None:
                storm.kill()
            storm.wait()
        close(engine)
    rate = sum(made) / elapsed
    with capsys.disabled():
        print(
            f"\nexit storm: {rate:.0f} exits/s for {elapsed:.0f} s ({made[0]} forks, "
            f"{made[1]} threads); records heard {heard}; overflows {listener.overflows}, "
            f"dropped {listener.dropped}; {passes} passes"
        )
    assert rate >= 5000
    assert listener.overflows == 0 and listener.dropped == 0
    assert (heard["forks"], heard["threads"]) == tuple(made)


FORGE = """
import socket, sys
port, data = int(sys.argv[1]), bytes.fromhex(sys.stdin.read())
sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16)  # NETLINK_GENERIC
sock.bind((0, 0))
try:
    sock.sendto(data, (port, 0))
    print("sent", flush=True)
except ConnectionRefusedError:  # the listener is connected to the kernel: no other port
    print("refused", flush=True)
"""


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
def test_a_forged_record_from_another_user_with_net_admin_counts_nothing(pod):  # noqa: F811
    """Another user holding CAP_NET_ADMIN alone (a hostNetwork pod with NET_ADMIN) sends the
    listener's port a well-formed TASKSTATS record of an hour on a CPU for a task of the
    pod, born since the last pass. The kernel refuses the send (the listener's socket is
    connected to the kernel's port), or, where it let it through, the listener refuses it
    as `not_kernel`: nothing of it is counted, the pod's sums stay its own."""
    import sys

    from tests.exitrecords import exit_message, taskstats

    cgroup_procs = os.path.join(pod["cgroup"], "cgroup.procs")
    engine = build_engine(replace(pod["options"], exits=True))
    victim = subprocess.Popen(["sh", "-c", f'echo $$ > "{cgroup_procs}"; exec sleep 60'])
    try:
        assert isinstance(engine.exits, ExitListener), "no exit records here"
        time.sleep(0.2)
        engine.run_pass()
        time.sleep(PASS_SECONDS)
        engine.run_pass()
        port = engine.exits._socket.getsockname()[0]
        hour_us = 3600 * 10**6
        stats = taskstats(victim.pid + 1, ppid=victim.pid, lived_us=10_000,
                          on_cpu=hour_us * 1000, utime_us=hour_us)  # fmt: skip
        data = exit_message(stats, victim.pid + 1)
        data = data[:4] + engine.exits.family.to_bytes(2, sys.byteorder) + data[6:]
        sent = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "--inh-caps=+net_admin", "--ambient-caps=+net_admin",
             sys.executable, "-c", FORGE, str(port)],
            input=data.hex(), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        outcome = sent.stdout.strip()
        assert outcome in ("sent", "refused"), sent.stderr
        deadline = time.monotonic() + (5 if outcome == "sent" else 1)
        while engine.exits.refused["not_kernel"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        result = engine.run_pass()
    finally:
        victim.kill()
        victim.wait()
        close(engine)
    _, fields = pod_interval(result, pod["uid"])
    assert fields.on_cpu_nanos < 10**9 and fields.cpu_user_nanos < 10**9, fields
    assert all(f.on_cpu_nanos < 100 * 10**9 for f in result.intervals.values())
    assert engine.exits.refused["not_kernel"] == (1 if outcome == "sent" else 0)
    print(f"\nthe forged record: {outcome}")
