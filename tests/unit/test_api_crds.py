"""crds/ is generated from the models: regenerate and fail on any difference; and the
generated schemas stay structural and CEL-cost-bounded."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuheal.api import gen, remediationpolicy

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("info", gen.CRDS, ids=lambda i: i.kind)
def test_committed_crd_matches_models(info: gen.CrdInfo) -> None:
    committed = (ROOT / "crds" / gen.file_name(info)).read_text()
    assert committed == gen.render(info), (
        f"crds/{gen.file_name(info)} is stale: run `python -m gpuheal.api.gen` and commit"
    )


def test_no_stray_files_in_crds() -> None:
    assert {p.name for p in (ROOT / "crds").glob("*.yaml")} == {gen.file_name(i) for i in gen.CRDS}


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("info", gen.CRDS, ids=lambda i: i.kind)
def test_schema_is_structural(info: gen.CrdInfo) -> None:
    doc = gen.crd_document(info)
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    forbidden = {"$ref", "$defs", "patternProperties", "propertyNames", "title", "default", "const"}
    for path, node in _walk(schema):
        assert not forbidden & node.keys(), f"{path}: {forbidden & node.keys()}"
        assert node.get("additionalProperties") not in (True, False), path
        for branch in node.get("anyOf", []):
            assert branch != {"type": "null"}, path


@pytest.mark.parametrize("info", gen.CRDS, ids=lambda i: i.kind)
def test_lists_and_strings_under_cel_are_bounded(info: gen.CrdInfo) -> None:
    """CEL cost estimation rejects rules over unbounded lists; bound every list."""
    schema = gen.crd_document(info)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema["properties"]["spec"]):
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path} has no maxItems"


def test_crd_names_and_columns() -> None:
    docs = {i.kind: gen.crd_document(i) for i in gen.CRDS}
    assert docs["RemediationPolicy"]["spec"]["names"]["shortNames"] == ["rp"]
    assert docs["ReservePool"]["spec"]["names"]["shortNames"] == ["rsvp"]
    assert docs["NodeRemediation"]["spec"]["names"]["shortNames"] == ["nrem"]
    for doc in docs.values():
        version = doc["spec"]["versions"][0]
        assert doc["spec"]["scope"] == "Cluster"
        assert version["subresources"] == {"status": {}}
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        assert status["conditions"]["x-kubernetes-list-type"] == "map"
        assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    columns = [
        c["name"]
        for c in docs["RemediationPolicy"]["spec"]["versions"][0]["additionalPrinterColumns"]
    ]
    assert {"Selected", "Unhealthy", "Breaker", "Age"} <= set(columns)


def test_generator_writes_files(tmp_path: pathlib.Path) -> None:
    written = gen.write_all(tmp_path)
    assert len(written) == len(gen.CRDS) == 4
    for path in written:
        assert yaml.safe_load(path.read_text())["kind"] == "CustomResourceDefinition"


def _properties(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field of a schema, as `kubectl explain` names it (lists and maps looked into)."""
    for name, prop in (node.get("properties") or {}).items():
        yield f"{path}.{name}", prop
        yield from _properties(prop, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _properties(node[key], path)


@pytest.mark.parametrize("info", gen.CRDS, ids=lambda i: i.kind)
def test_every_crd_field_has_a_description(info: gen.CrdInfo) -> None:
    """`kubectl explain <kind>.spec...` teaches: no field of the CRD is left undescribed."""
    schema = gen.crd_document(info)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = list(_properties(schema, info.singular))
    assert len(fields) > 30
    # Top-level metadata may carry nothing but its type (the API server documents ObjectMeta).
    undescribed = [
        path
        for path, prop in fields
        if not str(prop.get("description", "")).strip() and path != f"{info.singular}.metadata"
    ]
    assert not undescribed, f"fields without a description: {undescribed}"


def test_every_model_field_has_a_description() -> None:
    """`description=` on every pydantic field of the API models (the source of the above)."""
    import inspect

    from gpuheal.api import faulthistory, meta, noderemediation, reservepool

    models = {
        obj
        for module in (meta, remediationpolicy, noderemediation, reservepool, faulthistory)
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, meta.BaseModel) and obj.__module__ == module.__name__
    }
    assert remediationpolicy.Safety in models
    missing = [
        f"{model.__module__}.{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not missing, f"fields without description=: {sorted(missing)}"


def test_a_fields_own_description_wins_over_its_models_docstring() -> None:
    """`reservePoolRef: ObjectRef` says which object it refers to, not what an ObjectRef is."""
    doc = gen.crd_document(remediationpolicy.CRD)
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    step = spec["properties"]["rules"]["items"]["properties"]["ladder"]["items"]["properties"][
        "steps"
    ]["items"]["properties"]
    ref = step["replace"]["properties"]["reservePoolRef"]
    assert ref["description"] == "The ReservePool to take the spare from."
    assert step["reset"]["properties"]["hook"]["description"] == "How the reset is carried out."
