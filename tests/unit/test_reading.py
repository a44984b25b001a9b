"""The reading layer over copies of the fixture tree with files taken away or refused."""

from __future__ import annotations

import os
import shutil

import pytest

from collector.model import AccessDenied
from collector.procfs import ProcFS
from collector.reading import Reader
from tests.fixturetree import PASS1, ScriptedClock


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PASS1, root)
    return root


def reader(root, procfs_class=ProcFS) -> Reader:
    return Reader(procfs_class(str(root)), clock=ScriptedClock(), page_size=4096)


def test_a_thread_that_vanishes_mid_read_is_not_seen_but_its_process_counts(tree):
    (tree / "200" / "task" / "201" / "io").unlink()
    shutil.rmtree(tree / "1100" / "task" / "1101")
    readings = reader(tree).read_pass()
    by_pid = {r.pid: r for r in readings.processes}
    assert [t.tid for t in by_pid[200].threads] == [200]
    assert [t.tid for t in by_pid[1100].threads] == [1100]
    assert readings.vanished == 0


def test_a_process_that_vanishes_mid_read_is_counted_as_vanished(tree):
    (tree / "300" / "cgroup").unlink()  # gone after its stat was read
    shutil.rmtree(tree / "100" / "task")  # gone before its threads were listed
    (tree / "900" / "stat").unlink()  # gone between the listing and the first read
    readings = reader(tree).read_pass()
    assert readings.vanished == 3
    assert {300, 100, 900}.isdisjoint(r.pid for r in readings.processes)
    assert readings.unreadable == 0


def test_every_thread_gone_means_the_process_is_gone(tree):
    for task in (tree / "200" / "task").iterdir():
        (task / "schedstat").unlink()
    readings = reader(tree).read_pass()
    assert 200 not in {r.pid for r in readings.processes}
    assert readings.vanished == 1


class DeniedIO(ProcFS):
    """A ProcFS whose `io` files answer EACCES, as without ptrace rights over a process."""

    def read(self, path):
        pid = int(os.fsdecode(path)[len(self.root) + 1 :].split("/")[0])
        if path.endswith(b"/io") and pid in (200, 300):
            raise AccessDenied(os.fsdecode(path))
        return super().read(path)


def test_an_unreadable_process_keeps_its_footprint_and_is_counted(tree):
    readings = reader(tree, DeniedIO).read_pass()
    assert readings.unreadable == readings.denied == 2
    assert {200, 300}.isdisjoint(r.pid for r in readings.processes)
    footprint = {f.pid: f for f in readings.footprints}
    assert footprint[200].threads == 2
    assert footprint[200].rss_bytes == 5000 * 4096
    assert len(readings.processes) == 10  # the twelve of pass1 but these two


def test_malformed_files_are_unreadable_without_footprint_when_stat_is_bad(tree):
    (tree / "100" / "stat").write_bytes(b"100 (x) S 1\n")
    (tree / "200" / "task" / "201" / "schedstat").write_bytes(b"garbage\n")
    readings = reader(tree).read_pass()
    assert readings.unreadable == 2 and readings.denied == 0
    assert 100 not in {f.pid for f in readings.footprints}
    assert 200 in {f.pid for f in readings.footprints}


def test_a_thread_stat_cut_before_its_start_time_makes_its_process_unreadable(tree):
    """A thread's `stat` that ends before its start time (field 22) is malformed: its
    process is counted unreadable, with its footprint, and every other process is read;
    the pass goes on."""
    stat = tree / "200" / "task" / "201" / "stat"
    fields = stat.read_bytes().split()
    stat.write_bytes(b" ".join(fields[:21]) + b"\n")  # pid, comm, fields 3 to 21
    readings = reader(tree).read_pass()
    assert readings.unreadable == 1 and readings.vanished == 0
    assert 200 not in {r.pid for r in readings.processes}
    assert 200 in {f.pid for f in readings.footprints}
    assert len(readings.processes) == 11


def test_a_number_longer_than_int_takes_fails_one_process_not_the_pass(tree):
    """A `/proc` file with a number of 5000 digits (the kernel writes at most 20) is
    malformed: its process is unreadable (or, read whole, exact), every other process is
    read, and the pass completes."""
    (tree / "200" / "task" / "201" / "schedstat").write_bytes(b"1" * 5000 + b" 1 1\n")
    readings = reader(tree).read_pass()
    assert readings.unreadable + len(readings.processes) == 12
    assert len({r.pid for r in readings.processes} - {200}) == 11


def test_an_empty_or_missing_root_raises_for_the_caller():
    with pytest.raises(OSError):
        ProcFS("/nonexistent/proc").processes()


@pytest.mark.parametrize("size", [0, 8191, 8192, 20000])
def test_a_file_is_read_whole_whatever_its_length(tmp_path, size):
    (tmp_path / "f").write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    data = ProcFS(str(tmp_path)).read(os.fsencode(tmp_path / "f"))
    assert data == (tmp_path / "f").read_bytes() and len(data) == size
