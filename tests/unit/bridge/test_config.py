"""gpuheal-slurm-bridge's settings: flags over GPUHEAL_BRIDGE_* variables, the names the
helm chart and the systemd unit use, and refusals that say why."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpuheal_bridge.backends.cli import CliBackend
from gpuheal_bridge.backends.rest import RestBackend
from gpuheal_bridge.cli import build_backend, build_settings
from gpuheal_bridge.config import BridgeConfig, parse_config
from gpuheal_bridge.server.auth import Token

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_bridge_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("GPUHEAL_BRIDGE_")]:
        monkeypatch.delenv(name)


def test_defaults() -> None:
    config = parse_config([])
    assert config.listen == "127.0.0.1:8787"
    assert config.backend == "cli"
    assert config.state_dir == Path("/var/lib/gpuheal-bridge")
    assert config.slurm_timeout == 15
    assert config.node_map_table_only is False


def test_flag_wins_over_variable_and_variable_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEAL_BRIDGE_LISTEN", "0.0.0.0:9000")
    monkeypatch.setenv("GPUHEAL_BRIDGE_SLURM_TIMEOUT", "7")
    monkeypatch.setenv("GPUHEAL_BRIDGE_NODE_MAP_TABLE_ONLY", "1")
    config = parse_config(["--listen", "127.0.0.1:1234"])
    assert config.listen == "127.0.0.1:1234"
    assert config.slurm_timeout == 7
    assert config.node_map_table_only is True


def test_both_flag_spellings() -> None:
    """The helm chart writes ``--flag=value``; people type ``--flag value``."""
    a = parse_config(["--state-dir=/tmp/a", "--expedite-timeout=3", "--rest-write-fallback=cli"])
    b = parse_config(["--state-dir", "/tmp/a", "--expedite-timeout", "3"])
    assert a.state_dir == b.state_dir == Path("/tmp/a")
    assert a.expedite_timeout == b.expedite_timeout == 3
    assert a.rest_write_fallback == "cli"


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--backend", "slurmrestd"], "--backend: Input should be 'cli' or 'rest'"),
        (["--tls-cert", "/tls.crt"], "--tls-cert and --tls-key go together"),
        (["--backend", "rest"], "--backend rest needs --rest-url"),
        (["--slurm-timeout", "0"], "--slurm-timeout: Input should be greater than 0"),
        (["--idempotency-ttl", "a day"], "--idempotency-ttl: Input should be a valid number"),
    ],
)
def test_bad_settings_exit_with_the_reason(argv: list[str], why: str) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(argv)
    assert why in str(info.value)


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["--listen", "0.0.0.0:8787"], True),
        (["--listen", "[::]:8787"], True),
        (["--listen", "10.1.2.3:8787"], True),
        (["--listen", "slurm-ctl.example:8787"], True),  # a name: resolved later, not trusted
        (["--listen", "127.0.0.1:8787"], False),
        (["--listen", "[::1]:8787"], False),
        (["--listen", "localhost:8787"], False),
        (["--listen", "0.0.0.0:8787", "--tls-cert", "/c", "--tls-key", "/k"], False),
        (["--listen", "0.0.0.0:8787", "--insecure-http", "true"], False),
    ],
)
def test_plain_http_off_loopback_is_refused(argv: list[str], refused: bool) -> None:
    """Bearer tokens never cross a network in clear unless someone says so."""
    if refused:
        with pytest.raises(SystemExit, match="not a loopback address"):
            parse_config(argv)
    else:
        assert parse_config(argv).listen == argv[1]


def test_unknown_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--listen-on", "x"])
    assert "--listen-on" in capsys.readouterr().err


def _fields() -> set[str]:
    return set(BridgeConfig.model_fields)


def test_every_flag_the_helm_chart_passes_is_a_setting() -> None:
    template = (REPO / "deploy/helm/gpuheal/templates/slurm-bridge.yaml").read_text()
    flags = set(re.findall(r"^\s*- --([a-z-]+)=", template, re.M))
    assert len(flags) >= 10
    assert {f.replace("-", "_") for f in flags} <= _fields()


def test_every_variable_the_systemd_unit_sets_is_a_setting() -> None:
    unit = (REPO / "slurm-bridge/systemd/gpuheal-slurm-bridge.service").read_text()
    names = set(re.findall(r"GPUHEAL_BRIDGE_([A-Z_]+)=", unit))
    assert {"LISTEN", "TOKEN_FILE", "STATE_DIR", "TLS_CERT", "TLS_KEY"} <= names
    assert {n.lower() for n in names} <= _fields()


def test_settings_become_the_apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("operator:" + "x" * 32 + "\n")
    monkeypatch.setenv("GPUHEAL_BRIDGE_TOKEN_FILE", str(tokens))
    config = parse_config(["--state-dir", str(tmp_path), "--idempotency-ttl", "60"])
    settings = build_settings(config)
    assert settings.tokens == {"operator": Token("x" * 32)}
    assert settings.audit_log == tmp_path / "audit.jsonl"
    assert settings.idempotency_ttl == 60
    assert settings.backend.name == "cli"


def test_no_token_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no bearer tokens"):
        build_settings(parse_config(["--state-dir", str(tmp_path)]))


def test_rest_backend_with_fallback() -> None:
    argv = ["--backend=rest", "--rest-url=unix:/run/slurmrestd.sock", "--slurm-timeout=4"]
    plain = build_backend(parse_config(argv))
    assert isinstance(plain, RestBackend)
    assert plain.fallback is None
    backend = build_backend(parse_config([*argv, "--rest-write-fallback", "cli"]))
    assert isinstance(backend, RestBackend)
    assert isinstance(backend.fallback, CliBackend)
    assert backend.fallback.timeout == 4


def test_the_systemd_unit_runs_as_its_own_user_over_https(monkeypatch: pytest.MonkeyPatch) -> None:
    unit = (REPO / "slurm-bridge/systemd/gpuheal-slurm-bridge.service").read_text()
    service = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0] != "#"
    )
    assert (service["User"], service["Group"]) == ("gpuheal-bridge", "gpuheal-bridge")
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # reload = token rotation
    sysusers = (REPO / "slurm-bridge/systemd/gpuheal-slurm-bridge.sysusers").read_text()
    assert "u gpuheal-bridge " in sysusers
    for line in unit.splitlines():
        if line.startswith("Environment=GPUHEAL_BRIDGE_"):
            name, _, value = line.removeprefix("Environment=").partition("=")
            monkeypatch.setenv(name, value)
    config = parse_config([])  # what the unit starts with: accepted, HTTPS off loopback
    assert config.listen == "0.0.0.0:8787"
    assert config.tls_cert is not None
    assert config.insecure_http is False
