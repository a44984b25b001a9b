"""The tests' own cgroups (tests/cgroups.py): what a test run killed before its cleanup
left is removed by the next test that makes one."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.cgroups import _made, cgroup, hierarchy

pytestmark = pytest.mark.kernel


def test_what_a_killed_run_left_empty_is_removed_and_a_live_ones_is_kept():
    root = hierarchy("v2")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = os.path.join(root, f"procdelta-stale-{uuid.uuid4().hex}")
    kept = os.path.join(root, f"procdelta-kept-{uuid.uuid4().hex}")
    os.mkdir(stale)
    os.mkdir(os.path.join(stale, "child"))
    os.mkdir(kept)
    try:
        with _made() as made:
            made[stale] = made[os.path.join(stale, "child")] = dead.pid
            made[kept] = os.getpid()  # a live test's: never swept
        with cgroup("v2", f"procdelta-test-{uuid.uuid4().hex}"):
            assert not os.path.exists(stale)
            assert os.path.isdir(kept)
        with _made() as made:
            assert stale not in made and kept in made
    finally:
        with _made() as made:
            made.pop(kept, None)
        for path in (os.path.join(stale, "child"), stale, kept):
            if os.path.isdir(path):
                os.rmdir(path)
