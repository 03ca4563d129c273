"""`gpuheal history`: the window, the tables, and that it loads no Kubernetes client until it
talks to the cluster."""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys

import pytest

from gpuheal.api.faulthistory import EntryKind, FaultHistory
from gpuheal.cli.history import node_record, offenders_table, parse_window
from gpuheal.policy import faultrecord as fh
from gpuheal.policy.faultrecord import offenders
from gpuheal.policy.types import Observation

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
UUID = "GPU-8f6c1a2b-1111-2222-3333-444455556666"


def _history(node: str, *signals: tuple[int, dt.timedelta, str]) -> FaultHistory:
    entries = [
        fh.signal_entry(
            Observation(
                time=NOW - ago,
                xid=x,
                gpu="0000:3b:00" if gpu == UUID else gpu,
                gpu_uuid=gpu if gpu == UUID else None,
            )
        )
        for x, ago, gpu in signals
    ]
    entries.append(fh.event_entry(EntryKind.OUTCOME, NOW, "nrem-1", outcome="Replaced"))
    status = fh.summarise(entries, previous=None, now=NOW, retention=30 * DAY)
    return FaultHistory.model_validate(
        {"metadata": {"name": node}, "spec": {"nodeName": node}, "status": status.to_k8s()}
    )


def test_window() -> None:
    assert parse_window("7d") == 7 * DAY
    assert parse_window("36h") == 1.5 * DAY
    with pytest.raises(argparse.ArgumentTypeError):
        parse_window("a week")


def test_tables_list_repeat_offenders_first() -> None:
    bad = _history("gpu-7", (94, 3 * DAY, UUID), (94, DAY, UUID), (94, 2 * DAY, UUID))
    ok = _history("gpu-8", (79, 2 * DAY, "0000:5e:00"))
    old = _history("gpu-9", (79, 20 * DAY, "0000:5e:00"))
    rows = offenders([ok, bad, old], since=NOW - 7 * DAY, by_gpu=False)
    text = offenders_table(rows, now=NOW, by_gpu=False).splitlines()
    assert text[0].split() == ["NODE", "FAULTS", "XIDS", "INCIDENTS", "LAST", "FAULT", "LAST",
                               "OUTCOME"]  # fmt: skip
    assert text[1].split()[:3] == ["gpu-7", "3", "94x3"]
    assert text[2].split()[:3] == ["gpu-8", "1", "79"]
    assert len(text) == 3, "gpu-9's fault is older than the window"
    per_gpu = offenders_table(offenders([bad], since=NOW - 7 * DAY, by_gpu=True), now=NOW,
                              by_gpu=True)  # fmt: skip
    assert per_gpu.splitlines()[1].split()[:4] == ["gpu-7", UUID, "0000:3b:00", "3"]
    record = node_record(bad, since=NOW - 7 * DAY)
    assert record.splitlines()[0] == f"node gpu-7: 3 x XID 94 on {UUID} in 30d"
    assert f"GPU {UUID} (PCI 0000:3b:00): 3 fault(s), XIDs 94" in record
    assert "Outcome  outcome Replaced [nrem-1]" in record


def test_history_loads_no_kubernetes_client_to_parse() -> None:
    probe = (
        "import sys; from gpuheal.cli import build_parser; "
        "build_parser(['history']).parse_args(['history', '--window', '7d']); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'kopf', 'kubernetes', 'kubernetes_asyncio'})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == []


def test_explain_counts_the_fault_history_like_the_operator() -> None:
    """Two XIDs known only from the FaultHistory (their Events expired) and one Event: the
    Event's XID is the 3rd in the window, as the operator would count it."""
    from gpuheal.cli.explain import explain_node
    from tests.unit.test_cli_status_explain import NODE, xid_events
    from tests.unit.test_cli_status_explain import NOW as EXPLAIN_NOW
    from tests.unit.test_policy_select import make_policy

    past = [
        fh.signal_entry(Observation(time=EXPLAIN_NOW - dt.timedelta(minutes=m), xid=94,
                                    gpu="0000:3b:00", event_uid=f"old{m}"))
        for m in (30, 20)
    ]  # fmt: skip
    status = fh.summarise(past, previous=None, now=EXPLAIN_NOW, retention=30 * DAY)
    history = FaultHistory.model_validate(
        {"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}, "status": status.to_k8s()}
    )
    policy = make_policy()
    without, _ = explain_node(NODE, [policy], xid_events(55), [], now=EXPLAIN_NOW)
    assert "now: opens an incident (rule ecc, rung 0)" in "\n".join(without)
    with_history, _ = explain_node(
        NODE, [policy], xid_events(55), [], now=EXPLAIN_NOW, history=history
    )
    assert "now: opens an incident (rule ecc, rung 1)" in "\n".join(with_history)
