"""`gpuheal run` flags (each also GPUHEAL_<FLAG>) and `gpuheal simulate` parsing."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gpuheal.cli import build_parser
from gpuheal.config import config_from_args


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


def test_run_defaults_match_the_helm_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPUHEAL_METRICS_PORT", "GPUHEAL_SOURCES", "GPUHEAL_LOG_FORMAT"):
        monkeypatch.delenv(var, raising=False)
    cfg = config_from_args(parse(["run"]))
    assert (cfg.metrics_port, cfg.health_port) == (9090, 8080)
    assert cfg.sources == {"conditions", "events"}  # dcgm needs its namespace named
    assert (cfg.dcgm_selector, cfg.dcgm_daemonset) == (
        "app=nvidia-dcgm-exporter", "nvidia-dcgm-exporter")  # fmt: skip
    assert cfg.event_namespace == "default"
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
    dcgm = parse(["run", "--sources", "dcgm,conditions", "--dcgm-namespace", "gpu-operator"])
    assert config_from_args(dcgm).sources == {"dcgm", "conditions"}
    with pytest.raises(SystemExit, match="--dcgm-namespace: required with the dcgm source"):
        config_from_args(parse(["run", "--sources", "dcgm"]))
    with pytest.raises(SystemExit, match="--sources: unknown source"):
        config_from_args(parse(["run", "--sources", "events,smoke-signals"]))
    with pytest.raises(SystemExit, match="--metrics-port"):
        config_from_args(parse(["run", "--metrics-port", "http"]))


def test_simulate_parsers() -> None:
    args = parse(["simulate", "xid", "--node", "a", "--node", "b", "--xid", "79", "--condition"])
    assert (args.node, args.xid, args.condition, args.gpu) == (["a", "b"], 79, True, "0000:3b:00")
    cond = parse(["simulate", "condition", "--node", "a", "--type", "GpuDegraded"])
    assert (cond.type, cond.status) == ("GpuDegraded", "True")


def test_a_subcommand_loads_only_its_own_module() -> None:
    """`gpuheal xid parse` must not pay for kopf or a Kubernetes client at start."""
    probe = (
        "import sys; from gpuheal.cli import build_parser; "
        "build_parser(['xid', 'parse']).parse_args(['xid', 'parse']); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'kopf', 'kubernetes', 'kubernetes_asyncio'})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == []
    help_text = subprocess.run(
        [sys.executable, "-m", "gpuheal", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for command in ("run", "agent", "simulate", "xid", "status", "explain", "history"):
        assert command in help_text


def test_every_run_flag_says_what_it_does_and_its_variable() -> None:
    parser = build_parser(["run"])
    run = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    flags = [a for a in run._actions if a.option_strings and a.dest != "help"]
    assert len(flags) >= 17
    for action in flags:
        assert action.help, action.option_strings
        assert "$GPUHEAL_" in action.help, action.option_strings
