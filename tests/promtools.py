"""Debian's prometheus and promtool, for the tests that use them (where missing, they skip,
and fail under CI: tests/needs.py)."""

from __future__ import annotations

import subprocess

from tests.needs import tool


def binary(name: str, package: str = "prometheus") -> str:
    return tool(name, package)


def check_metrics(page: bytes) -> subprocess.CompletedProcess:
    """`promtool check metrics` on an exposition page: lint problems fail the caller."""
    return subprocess.run(
        [binary("promtool"), "check", "metrics"], input=page, capture_output=True, timeout=60
    )
