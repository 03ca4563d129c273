"""The chart's README.md is generated from values.yaml by hack/chart_readme.py: stale or
undocumented values fail here."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuheal"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_readme", ROOT / "hack" / "chart_readme.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chart_readme"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_committed_readme_is_the_generators_output() -> None:
    assert (CHART / "README.md").read_text() == GEN.render(CHART), (
        "deploy/helm/gpuheal/README.md is stale: run `python hack/chart_readme.py` and commit"
    )


def test_every_value_of_the_chart_is_in_the_readme() -> None:
    import yaml

    def leaves(node: object, path: str) -> list[str]:
        if isinstance(node, dict) and node:
            return [p for k, v in node.items() for p in leaves(v, f"{path}.{k}".lstrip("."))]
        return [path]

    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = {r.path for s in GEN.parse((CHART / "values.yaml").read_text()) for r in s.rows}
    for leaf in leaves(values, ""):
        # A leaf is documented itself or through a documented map above it.
        parts = leaf.split(".")
        covering = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        assert any(c in documented for c in covering), leaf
    for path in documented:
        assert f"| `{path}` |" in readme


def test_an_undocumented_value_is_an_error() -> None:
    text = "# -- Documented.\na: 1\ngroup:\n  # -- Also documented.\n  b: true\n  c: x\n"
    with pytest.raises(GEN.UndocumentedValue, match=r"group\.c"):
        GEN.parse(text)


def test_rows_sections_and_documented_maps() -> None:
    text = (
        "# -- Top scalar.\n"
        "top: 1\n"
        "\n"
        "# The group's introduction.\n"
        "group:\n"
        "  # -- A documented map: one row,\n"
        "  # its children need no comment.\n"
        "  resources:\n"
        "    limits:\n"
        "      memory: 1Gi\n"
        "  # -- A list: one row | with a pipe.\n"
        "  items:\n"
        "    - key: a\n"
        "      value: b\n"
        "  # -- After the list.\n"
        "  after: ''\n"
    )
    sections = GEN.parse(text)
    assert [s.key for s in sections] == ["", "group"]
    assert sections[1].intro == "The group's introduction."
    rows = {r.path: r for s in sections for r in s.rows}
    assert set(rows) == {"top", "group.resources", "group.items", "group.after"}
    assert (
        rows["group.resources"].description
        == "A documented map: one row, its children need no comment."
    )
    assert rows["group.resources"].default == '`{"limits":{"memory":"1Gi"}}`'
    assert rows["group.items"].description == "A list: one row \\| with a pipe."
    assert rows["group.after"].type == "string"


def test_check_mode_fails_on_a_stale_readme(tmp_path: pathlib.Path) -> None:
    for name in ("values.yaml", "README.tmpl.md"):
        (tmp_path / name).write_text((CHART / name).read_text())
    (tmp_path / "README.md").write_text("stale\n")
    assert GEN.main(["--check", "--chart", str(tmp_path)]) == 1
    assert GEN.main(["--chart", str(tmp_path)]) == 0
    assert GEN.main(["--check", "--chart", str(tmp_path)]) == 0
