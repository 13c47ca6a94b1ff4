"""JSON Schema validators for GitHub's ``release`` and ``release-asset`` components.

The OpenAPI subset in ``tests/data/github/openapi-releases-subset.json`` holds the component
schemas not dereferenced (``$ref: #/components/schemas/...``) under
``x-component-schemas-not-dereferenced``. A ``referencing`` registry resolves those refs; the two
components the subset lacks (``nullable-simple-user``, ``reaction-rollup``, ``rate-limit``) are taken from the
dereferenced path schemas where they are inlined. OpenAPI 3.0's ``nullable: true`` becomes a JSON
Schema ``null`` alternative.
"""

from __future__ import annotations

import copy
import json
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DATA = Path(__file__).resolve().parent.parent / "data" / "github"
OPENAPI = DATA / "openapi-releases-subset.json"


def _nullable(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_nullable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _nullable(v) for k, v in schema.items() if k != "nullable"}
    if schema.get("nullable"):
        t = out.get("type")
        if isinstance(t, str):
            out["type"] = [t, "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


@lru_cache(maxsize=1)
def components() -> dict[str, Any]:
    spec = json.loads(OPENAPI.read_text())
    comps = dict(spec["x-component-schemas-not-dereferenced"])
    paths = spec["paths"]
    asset_get = paths["/repos/{owner}/{repo}/releases/assets/{asset_id}"]["get"]["responses"]["200"]
    comps.setdefault("nullable-simple-user", asset_get["content"]["application/json"]["schema"]["properties"]["uploader"])
    rel_get = paths["/repos/{owner}/{repo}/releases/{release_id}"]["get"]["responses"]["200"]
    comps.setdefault("reaction-rollup", rel_get["content"]["application/json"]["schema"]["properties"]["reactions"])
    rate = paths["/rate_limit"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    comps.setdefault("rate-limit", rate["properties"]["rate"])
    return {k: _nullable(copy.deepcopy(v)) for k, v in comps.items()}


@cache
def validator(name: str, *, array: bool = False, relax_required: tuple[str, ...] = (),
              extra_states: tuple[str, ...] = ()) -> Draft202012Validator:
    """A validator for component ``name`` (an array of them with ``array=True``).

    ``relax_required`` drops properties from ``required`` (the recorded fixtures predate ``digest``);
    ``extra_states`` extends the asset ``state`` enum (GitHub returns ``starter``, which the
    description's enum ``uploaded|open`` lacks).
    """
    comps = copy.deepcopy(components())
    for comp in comps.values():
        if isinstance(comp, dict) and "required" in comp:
            comp["required"] = [r for r in comp["required"] if r not in relax_required]
    if extra_states:
        state = comps["release-asset"]["properties"]["state"]
        state["enum"] = [*state["enum"], *extra_states]
    resources = [(f"urn:gh#/components/schemas/{k}", Resource(v, specification=DRAFT202012)) for k, v in comps.items()]
    root = {"$id": "urn:gh", "components": {"schemas": comps}}
    registry = Registry().with_resources(resources).with_resource("urn:gh", Resource(root, specification=DRAFT202012))
    ref = {"$ref": f"urn:gh#/components/schemas/{name}"}
    schema = {"type": "array", "items": ref} if array else ref
    return Draft202012Validator(schema, registry=registry)


def errors(instance: Any, name: str, **kw: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name, **kw).iter_errors(instance)]
