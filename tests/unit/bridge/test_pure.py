"""Ownership, idempotency store, tokens, node mapping: pure logic, no Slurm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal_bridge.api.models import Owner
from gpuheal_bridge.api.names import INCIDENT_PATTERN, InvalidName
from gpuheal_bridge.nodemap import NodeMapper, NotMapped, load_table
from gpuheal_bridge.ownership import build_reason, classify, split_reason_suffix
from gpuheal_bridge.server.auth import (
    DEFAULT_SCOPES,
    Token,
    TokenAuth,
    load_tokens,
    parse_tokens,
)
from gpuheal_bridge.server.idempotency import IdempotencyStore, KeyMismatch, fingerprint

# ---- ownership ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "unavailable", "owner", "incident", "xid"),
    [
        ("gpuheal: nrem-abc xid=79", True, Owner.GPUHEAL, "nrem-abc", 79),
        ("gpuheal: nrem-abc", True, Owner.GPUHEAL, "nrem-abc", None),
        ("admin maintenance: fan swap", True, Owner.OTHER, None, None),
        ("slurm-operator: cordoned", True, Owner.OTHER, None, None),
        ("Not responding", True, Owner.OTHER, None, None),
        ("see gpuheal: later", True, Owner.OTHER, None, None),  # prefix, not substring
        (None, True, Owner.OTHER, None, None),  # drained without a reason: not ours
        ("gpuheal: nrem-abc xid=79", False, Owner.NONE, None, None),  # stale reason, not drained
    ],
)
def test_classify(
    reason: str | None, unavailable: bool, owner: Owner, incident: str | None, xid: int | None
) -> None:
    info = classify(reason, unavailable)
    assert (info.owner, info.incident, info.xid) == (owner, incident, xid)


@given(
    st.from_regex(INCIDENT_PATTERN, fullmatch=True), st.one_of(st.none(), st.integers(0, 100000))
)
def test_build_reason_roundtrip(incident: str, xid: int | None) -> None:
    reason = build_reason(incident, xid)
    assert reason.startswith("gpuheal: ")
    info = classify(reason, True)
    assert (info.owner, info.incident, info.xid) == (Owner.GPUHEAL, incident, xid)


def test_split_reason_suffix() -> None:
    assert split_reason_suffix("fan swap [root@2026-11-22T05:37:58]") == (
        "fan swap",
        "root",
        "2026-11-22T05:37:58",
    )
    assert split_reason_suffix("no suffix") == ("no suffix", None, None)


# ---- idempotency ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_store_replay_mismatch_ttl(tmp_path: Path) -> None:
    clock = Clock()
    store = IdempotencyStore(tmp_path / "idem.sqlite3", ttl=60, clock=clock)
    fp = fingerprint("POST", "/v1/jobs/1/requeue", {"mode": "requeue"})
    assert store.get("op", "k1", fp) is None
    store.put("op", "k1", fp, 200, {"outcome": "requeued"})
    stored = store.get("op", "k1", fp)
    assert stored is not None
    assert stored.body == {"outcome": "requeued"}
    assert store.get("other-client", "k1", fp) is None  # scoped per caller
    with pytest.raises(KeyMismatch):
        store.get("op", "k1", fingerprint("POST", "/v1/jobs/2/requeue", {"mode": "requeue"}))
    clock.t += 61
    assert store.get("op", "k1", fp) is None  # expired


def test_store_survives_restart_and_skips_5xx(tmp_path: Path) -> None:
    path = tmp_path / "idem.sqlite3"
    fp = fingerprint("POST", "/x", {})
    first = IdempotencyStore(path)
    first.put("op", "done", fp, 200, {"n": 1})
    first.put("op", "failed", fp, 503, {"error": "unavailable"})
    first.close()
    second = IdempotencyStore(path)
    assert second.get("op", "done", fp) is not None
    assert second.get("op", "failed", fp) is None  # a 503 must be retried for real


def test_fingerprint_is_order_independent() -> None:
    assert fingerprint("POST", "/a", {"x": 1, "y": 2}) == fingerprint(
        "POST", "/a", {"y": 2, "x": 1}
    )
    assert fingerprint("POST", "/a", {"x": 1}) != fingerprint("POST", "/b", {"x": 1})


# ---- tokens ---------------------------------------------------------------------------------


def test_parse_tokens_named_and_bare() -> None:
    tokens = parse_tokens("# comment\noperator:aaaaaaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbbbbbb\n")
    assert tokens["operator"] == Token("a" * 20, DEFAULT_SCOPES)
    assert Token("b" * 20) in tokens.values()


@pytest.mark.parametrize("text", ["op:short", "a:aaaaaaaaaaaaaaaaaaaa,b:aaaaaaaaaaaaaaaaaaaa"])
def test_parse_tokens_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="token"):
        parse_tokens(text)


def test_load_tokens_file_and_env(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("operator:" + "o" * 24 + "\n")
    tokens = load_tokens(f, env={"GPUHEAL_BRIDGE_TOKENS": "admin:" + "a" * 24})
    assert set(tokens) == {"operator", "admin"}


def test_token_auth() -> None:
    auth = TokenAuth({"operator": "o" * 24, "admin": "a" * 24})
    assert auth.who("Bearer " + "o" * 24) == "operator"
    assert auth.who("bearer " + "a" * 24) == "admin"
    for bad in (None, "", "Bearer", "Bearer " + "o" * 23, "Basic " + "o" * 24, "o" * 24):
        assert auth.who(bad) is None
    with pytest.raises(ValueError, match="no bearer tokens"):
        TokenAuth({})


# ---- node mapping ----------------------------------------------------------------------------


def test_identity_mapping_validates() -> None:
    mapper = NodeMapper()
    assert mapper.to_slurm("node1") == "node1"
    with pytest.raises(InvalidName):
        mapper.to_slurm("node[1-3]")


def test_template_mapping() -> None:
    mapper = NodeMapper(regex=r"^(?P<short>[^.]+)\.", template="{short}")
    assert mapper.to_slurm("gpu-7.example.com") == "gpu-7"
    with pytest.raises(NotMapped):
        mapper.to_slurm("nodots")
    assert NodeMapper(template="slurm-{name}").to_slurm("a1") == "slurm-a1"


def test_table_mapping(tmp_path: Path) -> None:
    lines = tmp_path / "map.txt"
    lines.write_text("# k8s slurm\nk8s-a node1\nk8s-b node2\n")
    as_json = tmp_path / "map.json"
    as_json.write_text(json.dumps({"k8s-a": "node1"}))
    assert load_table(lines) == {"k8s-a": "node1", "k8s-b": "node2"}
    assert load_table(as_json) == {"k8s-a": "node1"}
    mapper = NodeMapper.from_files(table_file=lines, table_only=True)
    assert mapper.to_slurm("k8s-b") == "node2"
    with pytest.raises(NotMapped):
        mapper.to_slurm("k8s-c")
    assert NodeMapper.from_files(table_file=lines).to_slurm("k8s-c") == "k8s-c"  # falls back
    with pytest.raises(InvalidName):
        NodeMapper(table={"a": "node[1-2]"})
