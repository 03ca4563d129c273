"""The test-only crash switch: parsing, counting, and nothing at all when unset."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuheal import crashpoints
from gpuheal.config import OperatorConfig


def test_parse_names_a_point_and_a_count() -> None:
    assert crashpoints.parse("cordon.after") == ("cordon.after", 1)
    assert crashpoints.parse("status.before:3") == ("status.before", 3)
    for bad in ("cordon", "cordon.during", "nope.after", "status.after:0", "status.after:x"):
        with pytest.raises(ValueError, match="crash point"):
            crashpoints.parse(bad)


def test_every_effect_has_a_before_and_an_after() -> None:
    assert len(crashpoints.POINTS) == 2 * len(crashpoints.EFFECTS)
    assert len(set(crashpoints.EFFECTS)) == len(crashpoints.EFFECTS)


def test_the_config_refuses_an_unknown_point_and_defaults_to_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert OperatorConfig().crash_at is None
    monkeypatch.setenv("GPUHEAL_CRASH_AT", "evict.after:2")
    assert OperatorConfig().crash_at == "evict.after:2"
    monkeypatch.setenv("GPUHEAL_CRASH_AT", "evict.sometime")
    with pytest.raises(ValueError, match="unknown crash point"):
        OperatorConfig()


def _run(spec: str, calls: str) -> subprocess.CompletedProcess[str]:
    code = f"from gpuheal import crashpoints as c\nc.arm({spec!r})\n{calls}\nprint('survived')"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=30
    )


def test_the_nth_time_at_the_armed_point_exits_hard_with_its_code() -> None:
    out = _run("status.after:2", "c.at('status', 'before')\nc.at('status', 'after')\n"
               "print('first')\nc.at('status', 'after')")  # fmt: skip
    assert out.returncode == crashpoints.EXIT_CODE
    assert out.stdout == "first\n"
    assert "crash point status.after:2 reached" in out.stderr


def test_unarmed_or_another_point_changes_nothing() -> None:
    assert _run("", "c.at('cordon', 'after')").stdout == "survived\n"
    out = _run("cordon.before", "c.at('cordon', 'after')\nc.at('claim', 'before')")
    assert (out.returncode, out.stdout) == (0, "survived\n")


def test_an_effect_not_in_the_list_is_a_mistake_when_armed() -> None:
    out = _run("cordon.after", "c.at('cordn', 'after')")
    assert out.returncode != 0
    assert "not in crashpoints.EFFECTS" in out.stderr
