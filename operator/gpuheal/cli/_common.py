"""What every subcommand shares, with nothing heavy imported: the parser class (a usage
mistake is one ``error: ...`` line), the cluster flags kubectl users expect, ``-o``, and how
a result is printed as JSON or YAML."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import enum
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn


class CliError(Exception):
    """A mistake or a cluster that cannot be used: printed as ``error: <message>``, exit 1,
    no traceback."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line, as kubectl does."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(1)


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--context``, read the way kubectl reads them."""
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        metavar="FILE",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    p.add_argument(
        "--context", metavar="NAME", help="kubeconfig context to use (default: its current one)"
    )


def add_output_flag(p: argparse.ArgumentParser, choices: Sequence[str], help_: str) -> None:
    p.add_argument(
        "-o", "--output", choices=list(choices), default=choices[0], metavar="FORMAT",
        help=f"{help_}: {'|'.join(choices)} (default: {choices[0]})",
    )  # fmt: skip


def plain(value: Any) -> Any:  # noqa: PLR0911 - one return per kind of value
    """``value`` as JSON-able data: dataclasses as objects (with their class as ``kind``),
    API models as the API has them, enums by value, times in RFC 3339, timedeltas in
    seconds."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"kind": type(value).__name__, **fields}
    if hasattr(value, "model_dump"):  # a pydantic model (a policy's rule or step): as in the API
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return value


def dump(data: Any, fmt: str) -> str:
    """JSON (indented, as ``kubectl -o json``) or YAML."""
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(plain(data), sort_keys=False, allow_unicode=True)).rstrip()
    return json.dumps(plain(data), indent=2, ensure_ascii=False)
