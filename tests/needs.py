"""What some tests need of the machine: a Debian tool (promtool, prometheus, podman, vmalert,
...) or root. Where one is missing, its tests skip on a developer's machine and fail under CI
(`.ci/run` sets PROCDELTA_CI=1, runs as root and installs every tool), so a missing need
never passes unseen."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

UNDER_CI = os.environ.get("PROCDELTA_CI") == "1"

ROOT_MARKERS = ("root", "kernel", "container")
"""The markers of tests that need root (pyproject.toml's `markers` says why each does)."""


def _missing(message: str) -> NoReturn:
    if UNDER_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def tool(name: str, package: str) -> str:
    """The path of `name`; else the test skips (fails under CI) naming its package."""
    path = shutil.which(name)
    if path is None:
        _missing(f"{name} not found: install Debian's {package} package (.ci/run does)")
    return path


def root(markers: list[str], euid: int | None = None) -> None:
    """Nothing as root; else the test skips (fails under CI) naming what it needs root for."""
    if (os.geteuid() if euid is None else euid) != 0:
        _missing(f"needs root (marked {', '.join(markers)}): run it as root, as .ci/run does")
