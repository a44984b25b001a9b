"""Checks shared by the kustomize base (tests/test_deploy.py) and the Helm chart's
renderings (tests/test_helm.py)."""

from __future__ import annotations


def assert_least_privilege(
    daemonset: dict, procfs: str = "/proc", cgroupfs: str = "/sys/fs/cgroup"
):
    """The DaemonSet keeps only what reading other users' /proc/<pid>/io needs, mounts the
    host read-only, and is restarted when its passes stop."""
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH", "SYS_PTRACE"]}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert all(mount["readOnly"] for mount in container["volumeMounts"])
    assert "--path.procfs=/host/proc" in container["args"]
    # the host's cgroupfs, read-only down to the v1 controllers mounted below it
    assert "--path.cgroupfs=/host/sys/fs/cgroup" in container["args"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["/host/sys/fs/cgroup"]["recursiveReadOnly"] in ("IfPossible", "Enabled")
    assert volumes[mounts["/host/sys/fs/cgroup"]["name"]]["hostPath"]["path"] == cgroupfs
    assert volumes[mounts["/host/proc"]["name"]]["hostPath"]["path"] == procfs
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]
    assert container["resources"]["limits"]["memory"]
