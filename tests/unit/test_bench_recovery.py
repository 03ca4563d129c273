"""fault_to_running says whether its figures were taken quiet, from the load it recorded."""

from __future__ import annotations

import os

from bench.recovery import _load_note


def test_the_load_note_says_quiet_only_below_the_machines_cpus() -> None:
    cpus = os.cpu_count() or 1
    quiet = _load_note({"before": [0.3, 0.7, 3.9], "after": [cpus * 1.0, 0.5, 3.0]})
    assert quiet.startswith("quiet: 1-minute load average at most")
    loaded = _load_note({"before": [0.3, 0.7, 3.9], "after": [cpus + 0.5, 0.5, 3.0]})
    assert "a quiet re-run gives the figures to quote" in loaded
