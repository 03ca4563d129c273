"""The operator starts as a uid with no passwd entry (the chart's 65532 in the image): kopf's
own identity (user@host from ``getpass.getuser()``) raised KeyError there, a crash loop at
start that only real pods under the chart showed."""

from __future__ import annotations

import getpass
from typing import Any

import kopf
import pytest

from gpuheal.config import OperatorConfig
from gpuheal.handlers import lifecycle


def test_run_gives_kopf_an_identity_so_no_passwd_entry_is_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_passwd_entry() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    seen: dict[str, Any] = {}

    def fake_run(**kwargs: Any) -> None:
        seen.update(kwargs)
        # what kopf does with it (kopf/_core/engines/peering.py, detect_own_id)
        if kwargs.get("identity") is None:
            getpass.getuser()

    monkeypatch.setattr(getpass, "getuser", no_passwd_entry)
    monkeypatch.setattr(kopf, "run", fake_run)
    monkeypatch.setenv("POD_NAME", "gpuheal-7c9f-abcde")
    lifecycle.run(OperatorConfig(health_port=0), serve_metrics=False)
    assert str(seen["identity"]).startswith("gpuheal-7c9f-abcde-")
