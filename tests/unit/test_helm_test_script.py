"""The chart's `helm test` checks (files/helm_test.py) fail with one line, not a traceback,
when the API server cannot be reached (their checks against a real install:
tests/integration/test_helm_test_checks.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = (
    Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuheal" / "files" / "helm_test.py"
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_api_server_fails_the_check_in_one_line(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    env = {
        "GPUHEAL_TEST_API_SERVER": f"https://127.0.0.1:{_closed_port()}",
        "GPUHEAL_TEST_API_TOKEN_FILE": str(token),
        "GPUHEAL_TEST_API_CA_FILE": "",
        "GPUHEAL_TEST_CRDS": "remediationpolicies.gpuheal.io",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "crds"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("FAIL: the API server https://127.0.0.1:"), out.stdout
    assert "does not answer" in out.stdout
