"""`gpuheal run` flags (each also GPUHEAL_<FLAG>) and `gpuheal simulate` parsing."""

from __future__ import annotations

import argparse

import pytest

from gpuheal.config import config_from_args
from gpuheal.operator import add_run_parser
from gpuheal.simulate import add_simulate_parser


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_simulate_parser(sub)
    return parser.parse_args(argv)


def test_run_defaults_match_the_helm_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPUHEAL_METRICS_PORT", "GPUHEAL_SOURCES", "GPUHEAL_LOG_FORMAT"):
        monkeypatch.delenv(var, raising=False)
    cfg = config_from_args(parse(["run"]))
    assert (cfg.metrics_port, cfg.health_port) == (9090, 8080)
    assert cfg.sources == {"conditions", "events", "dcgm"}
    assert cfg.dcgm_selector == "app=nvidia-dcgm-exporter"
    assert cfg.dcgm_interval == 15
    assert cfg.log_format == "json"


def test_run_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEAL_METRICS_PORT", "9999")
    monkeypatch.setenv("GPUHEAL_SOURCES", "events")
    monkeypatch.setenv("GPUHEAL_BRIDGE_URL", "https://bridge:8787")
    args = parse(["run", "--health-port", "1234", "--log-format", "plain",
                  "--bridge-token-file", "/t", "--dcgm-namespace", "gpu-operator"])  # fmt: skip
    cfg = config_from_args(args)
    assert (cfg.metrics_port, cfg.health_port, cfg.log_format) == (9999, 1234, "plain")
    assert cfg.sources == {"events"}
    assert (cfg.bridge_url, cfg.bridge_token_file) == ("https://bridge:8787", "/t")
    assert cfg.dcgm_namespace == "gpu-operator"
    assert config_from_args(parse(["run", "--sources", "dcgm,conditions"])).sources == {
        "dcgm", "conditions"}  # fmt: skip
    with pytest.raises(SystemExit):
        parse(["run", "--sources", "events,smoke-signals"])


def test_simulate_parsers() -> None:
    args = parse(["simulate", "xid", "--node", "a", "--node", "b", "--xid", "79", "--condition"])
    assert (args.node, args.xid, args.condition, args.gpu) == (["a", "b"], 79, True, "0000:3b:00")
    cond = parse(["simulate", "condition", "--node", "a", "--type", "GpuDegraded"])
    assert (cond.type, cond.status) == ("GpuDegraded", "True")
