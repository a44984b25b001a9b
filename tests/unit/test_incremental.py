"""The incremental reader (collector/reading.py) reads less, and its readings are
identical to the plain reader's (collector/plainread.py), independent code that reads
every file every pass.

Over a fixture tree changed in place (as the kernel changes /proc: a thread that has not
run keeps its schedstat, a reused TID gets a new directory) and over a live workload in
a sandbox cgroup, frozen while both readers read it.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter

from collector.plainread import PlainReader
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.tracker import Tracker
from tests.fixturetree import PASS1, SEC


class CountingProcFS(ProcFS):
    """A ProcFS that counts the files it reads, by name (`task/<name>` for a thread's)."""

    def __init__(self, root: str):
        super().__init__(root)
        self.reads: dict[str, int] = {}
        self.stat_read: set[int] = set()  # the PIDs whose own `stat` was read, until cleared
        self.by_pid: Counter[tuple[int, str]] = Counter()  # (pid, name) read, `task/` listed

    def read(self, path):
        relative = os.fsdecode(path)[len(self.root) + 1 :]
        pid, name = int(relative.split("/")[0]), relative.rsplit("/", 1)[1]
        if "/task/" in relative:
            name = "task/" + name
        elif name == "stat":
            self.stat_read.add(pid)
        self.reads[name] = self.reads.get(name, 0) + 1
        self.by_pid[pid, name] += 1
        return super().read(path)

    def threads(self, pid):
        self.by_pid[pid, "task/"] += 1
        return super().threads(pid)


def comparable(readings) -> dict:
    """Readings by PID without the instant, which differs between two readers."""
    return {r.pid: r._replace(at_ns=0) for r in readings}


EVERY = 16
"""The fast reader's bound here (K; collector/model.py's is larger): the fixture's PIDs are
chosen so that whole reads fall on the passes the tests below look at."""


def both(root: str):
    full = PlainReader(ProcFS(root), clock=lambda: 0, page_size=4096)
    fast_fs = CountingProcFS(root)
    fast = Reader(fast_fs, clock=lambda: 0, page_size=4096, whole_read_passes=EVERY)
    return full, fast, fast_fs


def write(path, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


def test_fixture_tree_changed_in_place(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PASS1, root)
    full, fast, fast_fs = both(str(root))
    tracks = (Tracker(100), Tracker(100))

    def step(listed_at: int) -> set[int]:
        """One pass of both readers; the PIDs read whole."""
        a, b = full.read_pass(), fast.read_pass()
        assert comparable(a.processes) == comparable(b.processes)
        deltas = [
            t.advance(r.processes, listed_at).deltas for t, r in zip(tracks, (a, b), strict=True)
        ]
        assert [(d.reading.pid, d.fields) for d in deltas[0]] == [
            (d.reading.pid, d.fields) for d in deltas[1]
        ]
        return {r.pid for r in a.processes}

    step(1000 * SEC)
    first = dict(fast_fs.by_pid)
    fast_fs.by_pid.clear()
    # Nothing changed: only stat and schedstat are read again, but for the processes due
    # to be read whole this pass (every file of theirs, as at their first sighting).
    seen = step(1001 * SEC)
    whole = {pid for pid in seen if not (pid + 2) % EVERY}
    assert {k: n for k, n in fast_fs.by_pid.items() if k[0] in whole} == {
        k: n for k, n in first.items() if k[0] in whole
    }
    more = {
        pid
        for (pid, name), n in fast_fs.by_pid.items()
        if n and name in ("task/status", "task/io", "task/stat")
    }
    assert more == whole
    schedstats = sum(n for (_, name), n in fast_fs.by_pid.items() if name == "task/schedstat")
    assert schedstats == sum(n for (_, name), n in first.items() if name == "task/schedstat")

    # Still nothing: the processes are quiet, and only those due to be read whole have
    # their `stat` read, and those read whole last pass (a whole read counts each thread
    # as having run: the pass after reads the process's `stat` rather than probing it).
    fast_fs.stat_read.clear()
    seen = step(1002 * SEC)
    due = {pid for pid in seen if not (pid + 3) % EVERY}
    assert fast_fs.stat_read & seen == due | whole
    assert len(seen - due - whole) >= 8

    # 400 exits and a new process gets its PID, its schedstat by chance the same bytes:
    # a new `<pid>` directory (a new inode number), so it is not taken for the old one.
    shutil.copytree(root / "400", root / "new400")
    for stat in ("new400/stat", "new400/task/400/stat"):  # the leader's start is the process's
        write(root / stat, (root / "400/stat").read_text().replace(" 1500 ", " 100070 "))
    shutil.rmtree(root / "400")
    os.rename(root / "new400", root / "400")
    fast_fs.stat_read.clear()
    step(1003 * SEC)
    assert 400 in fast_fs.stat_read

    # 200's leader ran (every counter moved); 201 only waited (run delay alone moved).
    write(root / "200/task/200/schedstat", "950000000 9000000 150\n")
    write(root / "200/task/200/status", "Name:\tjava\nvoluntary_ctxt_switches:\t40\n"
          "nonvoluntary_ctxt_switches:\t9\n")  # fmt: skip
    write(root / "200/task/200/io", io_text(16384, 4096))
    write(root / "200/io", io_text(8192 + 16384, 1000000 + 4096))  # the process sums them
    write(root / "200/task/201/schedstat", "40000000 2500000 90\n")
    # 1100's thread 1101 exited and its TID went to a new thread: a new directory, with a
    # new inode number (made before the old one goes, as procfs never reuses them soon).
    shutil.copytree(PASS1 / "1100/task/1100", root / "1100/task/new")
    write(root / "1100/task/new/stat", (PASS1 / "1100/task/1101/stat").read_text()
          .replace(" 1411 ", " 100050 "))  # fmt: skip
    shutil.rmtree(root / "1100/task/1101")
    os.rename(root / "1100/task/new", root / "1100/task/1101")
    # 300 gained a thread and lost one.
    shutil.copytree(PASS1 / "300/task/300", root / "300/task/303")
    write(root / "300/task/303/stat", (PASS1 / "300/task/300/stat").read_text()
          .replace("300 (", "303 (").replace(" 1200 ", " 100020 "))  # fmt: skip
    shutil.rmtree(root / "300/task/302")
    fast_fs.by_pid.clear()
    step(1004 * SEC)
    # 200 was quiet: its threads are listed and their schedstat read once each, by the
    # quiet attempt that finds the leader ran and the whole read that follows it.
    assert fast_fs.by_pid[200, "task/"] == 1
    assert fast_fs.by_pid[200, "task/schedstat"] == 2
    assert fast_fs.by_pid[200, "stat"] == 1
    # 300 starts a thread under a lower TID than 303 (TIDs wrap): 303 moves down the
    # listing and is still known by its inode; only the new thread's `stat` is read.
    shutil.copytree(PASS1 / "300/task/300", root / "300/task/301")
    write(root / "300/task/301/stat", (PASS1 / "300/task/300/stat").read_text()
          .replace("300 (", "301 (").replace(" 1200 ", " 100090 "))  # fmt: skip
    fast_fs.by_pid.clear()
    step(1005 * SEC)
    assert fast_fs.by_pid[300, "task/schedstat"] == 3
    assert fast_fs.by_pid[300, "task/stat"] == 1

    # Both of 200's threads run, pass after pass (passes 7 to 12). From the second such
    # pass its own `io` is read before its threads; when it has not moved since the last
    # pass read it, no thread's `io` is read, and when it has, every thread that ran has
    # its `io` read again. Pass 8 reads 200 whole ((200 + 8) % 16 == 0): every thread's
    # `io`, and not its own, so pass 9 has no total to compare with.
    assert not (200 + 8) % EVERY
    io_reads = []
    for n, (leader_io, total_io) in enumerate(
        [(None, None), (None, None), (None, None), ((16384, 8192), (24576, 1008192)),
         (None, None), (None, None)]
    ):  # fmt: skip
        write(root / "200/task/200/schedstat", f"{960000000 + n} 9000000 {151 + n}\n")
        write(root / "200/task/201/schedstat", f"{41000000 + n} 2500000 {91 + n}\n")
        if leader_io is not None:
            write(root / "200/task/200/io", io_text(*leader_io))
            write(root / "200/io", io_text(*total_io))
        fast_fs.by_pid.clear()
        step((1006 + n) * SEC)
        io_reads.append(fast_fs.by_pid[200, "task/io"])
    assert io_reads == [2, 2, 2, 2, 0, 0]


def io_text(read_bytes: int, write_bytes: int) -> str:
    return (
        "rchar: 1\nwchar: 1\nsyscr: 1\nsyscw: 1\n"
        f"read_bytes: {read_bytes}\nwrite_bytes: {write_bytes}\ncancelled_write_bytes: 0\n"
    )
