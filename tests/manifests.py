"""Checks shared by the kustomize base (tests/integration/test_deploy.py) and the Helm chart's
renderings (tests/integration/test_helm.py)."""

from __future__ import annotations

from collector.cli import cli


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
    env = environment(container)
    assert env["PROCDELTA_PATH_PROCFS"] == "/host/proc"
    # the host's cgroupfs, read-only down to the v1 controllers mounted below it
    assert env["PROCDELTA_PATH_CGROUPFS"] == "/host/sys/fs/cgroup"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["/host/sys/fs/cgroup"]["recursiveReadOnly"] in ("IfPossible", "Enabled")
    assert volumes[mounts["/host/sys/fs/cgroup"]["name"]]["hostPath"]["path"] == cgroupfs
    assert volumes[mounts["/host/proc"]["name"]]["hostPath"]["path"] == procfs
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]
    assert container["resources"]["limits"]["memory"]


def environment(container: dict) -> dict[str, str]:
    """A container's environment as kubelet gives it: the last of a name wins."""
    return {variable["name"]: variable["value"] for variable in container.get("env", [])}


def path_options() -> dict[str, str]:
    """{flag: environment variable} of every path option of `procdelta serve`: those that
    every command in the container (`once`, `top`) reads too."""
    return {
        param.opts[0]: param.envvar
        for param in cli.commands["serve"].params
        if param.opts[0].startswith("--path.")
    }


def assert_paths_from_env(daemonset: dict) -> None:
    """Every path procdelta reads comes from the container's environment, never from a
    flag (`serve`'s own would not reach a command run with `kubectl exec`), and names a
    read-only mount of the host's."""
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    options = path_options()
    assert len(options) == 4, options
    assert not [arg for arg in container["args"] if arg.split("=")[0] in options]
    env = environment(container)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for flag, variable in options.items():
        assert variable in env, f"{flag}: no {variable} in the container's environment"
        assert mounts[env[variable]]["readOnly"] is True, (flag, env[variable])
