"""The Debian tools some tests run (promtool, prometheus, podman, vmalert, ...): where one
is missing, its tests skip on a developer's machine and fail under CI (`.ci/run` sets
PROCDELTA_CI=1 and installs every one), so a missing tool never passes unseen."""

from __future__ import annotations

import os
import shutil

import pytest

UNDER_CI = os.environ.get("PROCDELTA_CI") == "1"


def tool(name: str, package: str) -> str:
    """The path of `name`; else the test skips (fails under CI) naming its package."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found: install Debian's {package} package (.ci/run does)"
        if UNDER_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path
