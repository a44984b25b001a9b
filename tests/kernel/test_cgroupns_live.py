"""A reader in a cgroup namespace of its own, on this host: it finds every process of its
pod (tests/unit/test_cgroupns.py holds the rest over plain files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.cgroups import Workload, cgroups, enter, hierarchy
from tests.unit.test_cgroupns import KINDS


@pytest.mark.kernel
@pytest.mark.parametrize("cgroupns", ["private", "host"])
def test_a_reader_in_its_own_pod_finds_every_process_of_it(tmp_path, cgroupns):
    """`procdelta once` in a pod cgroup of kubelet's layout, in a cgroup namespace of its
    own (`unshare --cgroup`, as a container on a v2 node) or the host's, beside a sibling
    process in the pod's pause cgroup: both are its pod's, named from the pod-log
    directory, and no label names a cgroup the host does not have."""
    uid = str(uuid.uuid4())
    pod = f"kubepods/besteffort/pod{uid}"
    logs = tmp_path / "pods"
    (logs / f"monitoring_procdelta-abc12_{uid}").mkdir(parents=True)
    with (
        cgroups(KINDS, f"{pod}/{'3c' * 32}") as reader,
        cgroups(KINDS, f"{pod}/{'9c' * 32}") as pause,
        Workload(list(pause.values())) as sibling,
    ):
        unshare = "exec unshare --cgroup " if cgroupns == "private" else "exec "
        command = (
            f"{enter(list(reader.values()))} && {unshare}{sys.executable} -m collector once "
            f"--interval 0.5 --format json --path.pod-logs {logs} "
            f"--path.container-logs {tmp_path}"
        )
        result = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, timeout=60, check=False
        )
        assert sibling.process.poll() is None
    assert result.returncode == 0, result.stderr
    assert "could not find" not in result.stderr
    groups = json.loads(result.stdout)["groups"]
    (own,) = [g for g in groups if g["group"].get("uid") == uid]
    assert own["group"] == {
        "namespace": "monitoring",
        "pod": "procdelta-abc12",
        "uid": uid,
        "qos": "besteffort",
    }
    assert own["processes"] == 2  # the reader and its sibling
    labels = [g["group"]["cgroup"] for g in groups if "cgroup" in g["group"]]
    assert labels, "the host's own processes are grouped by cgroup"
    roots = [hierarchy(kind) for kind in KINDS]
    for label in labels:
        assert any(os.path.isdir(root + label) for root in roots), label
