"""The names of pods and containers, from the files kubelet writes on the node: no API
access is needed. A reader of the node beside collector/procfs.py and
collector/cgroupfs.py; collector/groups.py names the groups with it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str


class PodNames:
    """Pod and container names from the files kubelet writes on the node.

    `/var/log/pods/<namespace>_<pod>_<uid>/` gives a pod's names by UID and
    `/var/log/containers/<pod>_<namespace>_<container>-<container id>.log` a container's
    name by ID. Re-read only when a directory's mtime changes.
    """

    _CONTAINER_LOG = re.compile(
        r"^(?P<pod>[^_]+)_(?P<ns>[^_]+)_(?P<name>.+)-(?P<cid>[0-9a-f]+)\.log$"
    )

    def __init__(
        self, pod_logs: str = "/var/log/pods", container_logs: str = "/var/log/containers"
    ):
        self.pod_logs = pod_logs
        self.container_logs = container_logs
        self._pods: dict[str, PodInfo] = {}
        self._containers: dict[str, str] = {}
        self._pods_mtime: int | None = None
        self._containers_mtime: int | None = None

    def refresh(self) -> bool:
        """Re-read what changed; True if any name may have changed."""
        changed = False
        pods_mtime = _mtime(self.pod_logs)
        if pods_mtime != self._pods_mtime:
            self._pods = self._read_pods()
            self._pods_mtime = pods_mtime
            changed = True
        containers_mtime = _mtime(self.container_logs)
        if containers_mtime != self._containers_mtime:
            self._containers = self._read_containers()
            self._containers_mtime = containers_mtime
            changed = True
        return changed

    def pod(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def container(self, container_id: str) -> str | None:
        return self._containers.get(container_id)

    def _read_pods(self) -> dict[str, PodInfo]:
        pods = {}
        for entry in _listdir(self.pod_logs):
            parts = entry.split("_")
            if len(parts) == 3 and all(parts):
                namespace, name, uid = parts
                pods[uid] = PodInfo(namespace, name)
        return pods

    def _read_containers(self) -> dict[str, str]:
        containers = {}
        for entry in _listdir(self.container_logs):
            match = self._CONTAINER_LOG.match(entry)
            if match is not None:
                containers[match["cid"]] = match["name"]
        return containers


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
