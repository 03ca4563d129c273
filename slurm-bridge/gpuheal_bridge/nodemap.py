"""Kubernetes node name -> Slurm node name.

Identity by default; or a regex + template (``--node-map-regex '^(?P<short>[^.]+)\\.'``
``--node-map-template '{short}'`` maps ``gpu-7.example.com`` to ``gpu-7``); or a lookup table
file (JSON object, or lines ``k8s-name slurm-name``), which wins over the template for the
names it lists. Every result is validated as a single Slurm node name, and, with an
allowlist (``--allowed-nodes gpu-[01-64]``, a Slurm hostlist), must be one of its nodes: a
token can then act on the nodes Kubernetes manages and on no other node of the Slurm cluster.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpuheal_bridge.api.names import validate_node_name
from gpuheal_bridge.hostlist import expand


class NotMapped(LookupError):
    """The name has no Slurm node (table without it, regex that does not match)."""


class NotAllowed(Exception):
    """The Slurm node is outside the bridge's allowlist (``--allowed-nodes``)."""


class NodeMapper:
    def __init__(
        self,
        *,
        template: str | None = None,
        regex: str | None = None,
        table: dict[str, str] | None = None,
        table_only: bool = False,
        allowed: str | None = None,
    ) -> None:
        self.template = template
        # None: every node (the bridge warns at start); else the Slurm names it may act on.
        self.allowed_expr = allowed or None
        self.allowed = frozenset(expand(allowed)) if allowed else None
        self.regex = re.compile(regex) if regex else None
        self.table = dict(table or {})
        self.table_only = table_only
        for slurm in self.table.values():
            validate_node_name(slurm)

    @classmethod
    def from_files(
        cls,
        *,
        template: str | None = None,
        regex: str | None = None,
        table_file: str | Path | None = None,
        table_only: bool = False,
        allowed: str | None = None,
    ) -> NodeMapper:
        table = load_table(Path(table_file)) if table_file else None
        return cls(
            template=template, regex=regex, table=table, table_only=table_only, allowed=allowed
        )

    def to_slurm(self, k8s_name: str) -> str:
        """Map and validate (raises InvalidName for a bad input, NotMapped for no mapping,
        NotAllowed for a Slurm node outside the allowlist)."""
        name = self._map(k8s_name)
        if self.allowed is not None and name not in self.allowed:
            shown = k8s_name if name == k8s_name else f"{k8s_name} (Slurm {name})"
            raise NotAllowed(
                f"{shown} is not in the bridge's allowed nodes ({self.allowed_expr}): "
                "nothing was done"
            )
        return name

    def _map(self, k8s_name: str) -> str:
        validate_node_name(k8s_name)
        if k8s_name in self.table:
            return self.table[k8s_name]
        if self.table_only:
            raise NotMapped(f"{k8s_name} is not in the node map table")
        groups: dict[str, str] = {"name": k8s_name}
        if self.regex is not None:
            m = self.regex.search(k8s_name)
            if m is None:
                raise NotMapped(f"{k8s_name} does not match the node map regex")
            groups.update({k: v for k, v in m.groupdict().items() if v is not None})
        name = self.template.format(**groups) if self.template else k8s_name
        return validate_node_name(name)


def load_table(path: Path) -> dict[str, str]:
    text = path.read_text()
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        return {str(k): str(v) for k, v in data.items()}
    table: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}: expected 'k8s-name slurm-name', got {raw!r}")
        table[parts[0]] = parts[1]
    return table
