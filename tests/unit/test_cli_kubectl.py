"""The CLI as kubectl users expect it: `kubectl gpuheal`, -o table|wide|json|yaml, -w is
watch, --context/--kubeconfig, --version, help on every flag, and one `error:` line (exit 1)
for a mistake or a cluster that cannot be used, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from gpuheal.cli import build_parser
from gpuheal.cli._common import dump
from gpuheal.cli.explain import explain_node, explanation
from gpuheal.cli.status import render
from tests.integration.operator_harness import free_port
from tests.unit.test_cli_status_explain import NODE, NOW, NREM, nrem, xid_events
from tests.unit.test_policy_select import make_policy

COMMANDS = ("run", "agent", "simulate", "xid", "status", "explain")


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _all_parsers(sub)
    return found


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_and_argument_says_what_it_is(command: str) -> None:
    parser = build_parser([command])
    for p in _all_parsers(parser):
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            assert action.help, (p.prog, action.option_strings or action.dest)


def test_status_flags_as_kubectl_has_them() -> None:
    args = build_parser(["status"]).parse_args(
        ["status", "-w", "-o", "json", "--context", "prod", "--kubeconfig", "/k"]
    )
    assert (args.watch, args.output, args.context, args.kubeconfig) == (True, "json", "prod", "/k")
    assert build_parser(["status"]).parse_args(["status", "-o", "wide"]).watch is False
    explain = build_parser(["explain"]).parse_args(["explain", "n1", "-o", "yaml"])
    assert (explain.node, explain.output) == ("n1", "yaml")


def test_status_renders_as_table_wide_json_and_yaml() -> None:
    table = render([NREM], "table", now=NOW).splitlines()
    assert table[0].split()[:3] == ["NAME", "NODE", "RULE"]
    assert len(table) == 2
    assert "requeue/cordon" in render([NREM], "wide", now=NOW)
    doc = json.loads(render([NREM], "json", now=NOW))
    assert doc["kind"] == "IncidentList"
    (item,) = doc["items"]
    assert (item["name"], item["node"], item["xid"], item["state"]) == (
        "nrem-n1-1", "n1", 94, "Returned")  # fmt: skip
    assert (item["tookSeconds"], item["ageSeconds"]) == (0.9, 10)
    assert [s["step"] for s in item["steps"]] == ["Detected", "requeue/cordon", "Completed"]
    assert item["steps"][1]["sincePreviousSeconds"] == 0.025
    assert yaml.safe_load(render([NREM], "yaml", now=NOW)) == doc
    assert render([], "table", now=NOW) == ""
    assert json.loads(render([], "json", now=NOW)) == {"kind": "IncidentList", "items": []}


def test_explain_as_json_is_the_engines_own_answers() -> None:
    policy = make_policy()
    lines, verdicts = explain_node(NODE, [policy], xid_events(50), [nrem(policy)], now=NOW)
    doc = json.loads(dump(explanation("n1", lines, verdicts, now=NOW), "json"))
    assert doc["node"] == "n1"
    assert doc["lines"] == lines
    assert len(doc["verdicts"]) == len(verdicts)
    last = doc["verdicts"][-1]
    decision = verdicts[-1].decision
    assert last["decision"]["kind"] == type(decision).__name__
    assert last["decision"]["reason"] == str(decision.reason)
    assert last["says"] in "\n".join(lines)
    assert yaml.safe_load(dump(explanation("n1", lines, verdicts, now=NOW), "yaml")) == doc


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuheal", *argv], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": "operator:slurm-bridge", **(env or {})}, check=False,
    )  # fmt: skip


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (("status", "--kubeconfig", "/nowhere/kc"), {}, "kubeconfig /nowhere/kc: no such file"),
        (("status",), {"KUBECONFIG": "", "HOME": "/nonexistent"}, "no cluster to talk to"),
        (("status", "--context", "nope"), {}, "Expected object with name nope"),
        (("explain", "n1", "-o", "json"), {}, "cannot reach the Kubernetes API server at https://127.0.0.1:"),
        (("status", "-o", "json"), {}, "Connection refused"),
        (("simulate", "xid", "--node", "n1", "--xid", "79"), {}, "Connection refused"),
        (("status", "-o", "xml"), {}, "invalid choice: 'xml'"),
        (("status", "--wide"), {}, "unrecognized arguments: --wide"),
    ],
)  # fmt: skip
def test_mistakes_and_unreachable_clusters_are_one_error_line(
    tmp_path: Path, argv: tuple[str, ...], env: dict[str, str], said: str
) -> None:
    kubeconfig = _kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}")  # nothing listens
    out = _cli(*argv, env={"KUBECONFIG": str(kubeconfig), **env})
    assert out.returncode == 1, out
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ")
    assert said in lines[0]
    assert "Traceback" not in out.stderr


def test_version_and_the_kubectl_plugin_name() -> None:
    out = _cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == "gpuheal 0.1.0"
    scripts = tomllib.loads(Path("pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-gpuheal"] == "gpuheal.cli:kubectl_main"
    plugin = subprocess.run(
        [sys.executable, "-c", "import sys; from gpuheal.cli import kubectl_main; "
         "sys.argv = ['kubectl-gpuheal', 'status', '--bogus']; sys.exit(kubectl_main())"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert plugin.returncode == 1
    assert plugin.stderr == (
        "error: unrecognized arguments: --bogus (see 'kubectl gpuheal --help')\n"
    )
