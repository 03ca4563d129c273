"""Generate the Helm chart's README.md from its values.yaml (what helm-docs does, in one file).

    python hack/chart_readme.py           # rewrite deploy/helm/gpuheal/README.md
    python hack/chart_readme.py --check   # exit 1 when the committed README is stale

The README is README.tmpl.md (next to values.yaml) with `{{ values }}` replaced by one table
per top-level key. A value's description is the `# --` comment block right above it (the
lines after `# --` continue it); a plain comment block right above a top-level map introduces
its section; top-level values that are not maps go under "General". A documented map is one
row (its children only when they have a `# --` of their own); an undocumented map is a group
whose values are listed one by one. Every value outside a documented map must be documented:
an undocumented one is an error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "gpuheal"
PLACEHOLDER = "{{ values }}"
GENERAL = ""  # the section of top-level values that are not maps
_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_.\"/-]+):(?:\s|$)")
_MISSING = object()


class UndocumentedValue(Exception):
    pass


@dataclass
class Row:
    path: str
    type: str
    default: str
    description: str


@dataclass
class Section:
    key: str
    intro: str = ""
    rows: list[Row] = field(default_factory=list)


@dataclass
class _Frame:
    indent: int
    key: str
    opaque: bool  # inside a documented map: children are optional


def _lookup(data: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return _MISSING
        data = data[key]
    return data


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number" if isinstance(value, float) else "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if value is None:
        return "null"
    return "object"


def _default(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


class _Parser:
    """Reads values.yaml line by line, keeping the path of the current key by indentation."""

    def __init__(self, values_text: str) -> None:
        self.data = yaml.safe_load(values_text) or {}
        self.sections: list[Section] = []
        self.stack: list[_Frame] = []
        self.doc: list[str] = []  # the `# --` block being read
        self.note: list[str] = []  # a plain comment block being read
        self.in_doc = False
        self.skip_below: int | None = None  # the lines of a list value
        self.undocumented: list[str] = []

    def feed(self, line: str) -> None:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if self.skip_below is not None:
            if not stripped or indent > self.skip_below or stripped.startswith("-"):
                return
            self.skip_below = None
        if not stripped:
            self.doc, self.note, self.in_doc = [], [], False
        elif stripped.startswith("#"):
            self._comment(stripped)
        else:
            match = _KEY.match(line)
            if match is not None and not stripped.startswith("-"):
                self._key(match.group("key").strip('"'), indent)

    def _comment(self, stripped: str) -> None:
        if stripped.startswith("# --"):
            self.doc, self.in_doc = [stripped[4:].strip()], True
        elif self.in_doc:
            self.doc.append(stripped.lstrip("#").strip())
        else:
            self.note.append(stripped.lstrip("#").strip())

    def _key(self, key: str, indent: int) -> None:
        while self.stack and self.stack[-1].indent >= indent:
            self.stack.pop()
        path = [f.key for f in self.stack] + [key]
        value = _lookup(self.data, path)
        if value is _MISSING:
            raise UndocumentedValue(f"{'.'.join(path)}: not found in the parsed values")
        description = " ".join(d for d in self.doc if d)
        is_map = isinstance(value, dict) and bool(value)
        opaque_parent = bool(self.stack) and self.stack[-1].opaque
        if not self.stack:
            if is_map:
                self.sections.append(Section(key, intro=" ".join(n for n in self.note if n)))
            elif not self.sections or self.sections[-1].key != GENERAL:
                self.sections.append(Section(GENERAL))
        self.doc, self.note, self.in_doc = [], [], False
        dotted = ".".join(path)
        if description:
            row = Row(dotted, _type(value), _default(value), _cell(description))
            self.sections[-1].rows.append(row)
        if is_map:
            self.stack.append(_Frame(indent, key, opaque=opaque_parent or bool(description)))
            return
        if isinstance(value, list) and value:
            self.skip_below = indent
        if not description and not opaque_parent:
            self.undocumented.append(dotted)


def parse(values_text: str) -> list[Section]:
    """values.yaml text -> sections of documented rows (raises UndocumentedValue)."""
    parser = _Parser(values_text)
    for line in values_text.splitlines():
        parser.feed(line)
    if parser.undocumented:
        raise UndocumentedValue(
            "values without a `# --` description: " + ", ".join(parser.undocumented)
        )
    return parser.sections


def render_values(sections: list[Section]) -> str:
    out: list[str] = []
    for section in sections:
        out.append(f"### `{section.key}`\n" if section.key != GENERAL else "### General\n")
        if section.intro:
            out.append(f"{section.intro}\n")
        out.append("| Key | Type | Default | Description |")
        out.append("|-----|------|---------|-------------|")
        out.extend(
            f"| `{r.path}` | {r.type} | {r.default} | {r.description} |" for r in section.rows
        )
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def render(chart: Path = CHART) -> str:
    template = (chart / "README.tmpl.md").read_text()
    if PLACEHOLDER not in template:
        raise ValueError(f"{chart / 'README.tmpl.md'} has no {PLACEHOLDER}")
    values = render_values(parse((chart / "values.yaml").read_text()))
    return template.replace(PLACEHOLDER, values.rstrip("\n"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when README.md is stale")
    parser.add_argument("--chart", type=Path, default=CHART)
    args = parser.parse_args(argv)
    try:
        text = render(args.chart)
    except UndocumentedValue as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    readme = args.chart / "README.md"
    if args.check:
        if not readme.exists() or readme.read_text() != text:
            print(f"error: {readme} is stale: run `python hack/chart_readme.py`", file=sys.stderr)
            return 1
        return 0
    readme.write_text(text)
    print(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
