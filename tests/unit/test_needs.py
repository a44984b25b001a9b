"""A test whose Debian tool is missing skips on a developer's machine and fails under CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import needs

ROOT = Path(__file__).parents[2]


def test_a_tool_found_is_its_path():
    assert needs.tool("sh", "dash").endswith("/sh")


@pytest.mark.parametrize(("under_ci", "outcome"), [(False, pytest.skip.Exception),
                                                   (True, pytest.fail.Exception)])  # fmt: skip
def test_a_missing_tool_skips_the_test_and_fails_it_under_ci(monkeypatch, under_ci, outcome):
    monkeypatch.setattr(needs, "UNDER_CI", under_ci)
    with pytest.raises(outcome) as raised:
        needs.tool("procdelta-no-such-tool", "procdelta-none")
    assert str(raised.value.msg) == (
        "procdelta-no-such-tool not found: install Debian's procdelta-none package (.ci/run does)"
    )


class Item:
    """What the hook reads of a collected test: its markers."""

    def __init__(self, *marks):
        self.own_markers = list(marks)

    def get_closest_marker(self, name):
        return next((mark for mark in self.own_markers if mark.name == name), None)

    def add_marker(self, mark):
        self.own_markers.append(mark.mark)


def test_a_container_test_has_more_time_than_the_rest(request):
    """pyproject.toml's `timeout` for every test; 45 minutes for a container test, which
    may build the base image first, unless it says its own."""
    from tests.conftest import pytest_collection_modifyitems

    assert request.config.getini("timeout") == "1200"
    plain, container = Item(), Item(pytest.mark.container.mark)
    own = Item(pytest.mark.container.mark, pytest.mark.timeout(60).mark)
    pytest_collection_modifyitems(request.config, [plain, container, own])
    assert plain.get_closest_marker("timeout") is None
    assert container.get_closest_marker("timeout").args == (2700,)
    assert own.get_closest_marker("timeout").args == (60,)


@pytest.mark.parametrize(("under_ci", "outcome"), [(False, pytest.skip.Exception),
                                                   (True, pytest.fail.Exception)])  # fmt: skip
def test_a_test_needing_root_skips_without_it_and_fails_under_ci(monkeypatch, under_ci, outcome):
    monkeypatch.setattr(needs, "UNDER_CI", under_ci)
    with pytest.raises(outcome) as raised:
        needs.root(["kernel", "container"], euid=65534)
    assert str(raised.value.msg) == (
        "needs root (marked kernel, container): run it as root, as .ci/run does"
    )
    assert needs.root(["kernel"], euid=0) is None


@pytest.mark.parametrize("marker", ["root", "kernel", "container"])
def test_every_marker_of_root_is_checked_before_its_test_runs(monkeypatch, marker):
    from tests.conftest import pytest_runtest_setup

    monkeypatch.setattr(needs, "UNDER_CI", False)
    monkeypatch.setattr(needs.os, "geteuid", lambda: 65534)
    assert pytest_runtest_setup(Item(pytest.mark.timeout(1).mark)) is None
    with pytest.raises(pytest.skip.Exception, match=f"marked {marker}"):
        pytest_runtest_setup(Item(getattr(pytest.mark, marker).mark))
    monkeypatch.setattr(needs.os, "geteuid", lambda: 0)
    assert pytest_runtest_setup(Item(getattr(pytest.mark, marker).mark)) is None


def test_every_test_is_in_the_serial_lane_but_those_that_wait():
    """Under two workers, the files that wait on a server's pace run in one, every other
    test one at a time in the other: none is left to be spread."""
    from tests.conftest import WAITS, lane

    assert WAITS and all((ROOT / path).is_file() for path in WAITS)
    assert lane("tests/integration/test_rules_live.py::test_the_rules[x]") == "waits"
    assert lane("tests/kernel/test_findings_kernel.py::test_a_pinned_victim_of_a_hog") == "serial"
    assert lane("tests/unit/test_needs.py::test_a_tool_found_is_its_path") == "serial"
