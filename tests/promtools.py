"""Debian's prometheus and promtool, required by the tests that use them (never skipped)."""

from __future__ import annotations

import shutil
import subprocess


def binary(name: str, package: str = "prometheus") -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: install Debian's {package} package (.ci/run does)"
    return path


def check_metrics(page: bytes) -> subprocess.CompletedProcess:
    """`promtool check metrics` on an exposition page: lint problems fail the caller."""
    return subprocess.run(
        [binary("promtool"), "check", "metrics"], input=page, capture_output=True, timeout=60
    )
