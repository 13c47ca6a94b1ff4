"""Load versions.yaml once, validate it completely, and return typed records.

Validation runs in two passes: the JSON Schema shipped beside the file
(structure, types, unknown keys) and the semantic rules a schema cannot say
(names that must exist in build_matrix, the runner policy, duplicate rows,
builder scripts and patches that must exist). The first problem found is
raised as a ConfigError whose message is one line:

    versions.yaml: components.apex.arch_overrides.aarch64.runs_on: <what>; <fix>

``arch_overrides`` are merged into the component's settings by
:func:`merge_settings`: mappings (``extra_env``) merge key by key, every other
value is replaced. The anchor's shallow ``dict.update`` silently dropped the
base ``extra_env`` keys an override did not repeat.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import yaml
from packaging.utils import canonicalize_name

from ci.base.errors import ConfigError
from ci.formats.archs import ArchList, parse_arch, parse_arch_list
from ci.model.naming import cuda_label, ref_format_problem, release_tag, tag_problem, version_key
from ci.model.shards import BUILDER_DECLARATION, builds_by_shards

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "versions.schema.json"
DEFAULT_VERSIONS = REPO_ROOT / "versions.yaml"


def _frozen(value: Any) -> Any:
    """A setting's value as Settings holds it: lists become tuples, mappings sorted dicts."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    if isinstance(value, Mapping):
        return dict(sorted(value.items()))
    return value


def _setting_schemas() -> dict[str, Any]:
    """The schema's ``$defs.settings.properties``: every setting's name, type and (where it has one) default."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]["settings"]["properties"]


# The schema is the one list of setting names, and its ``default``s are what a component gets for the
# settings it leaves out (the two without one, builder and runs_on, are required). Settings below has one
# field per name; tests/test_versions.py checks that every list agrees.
_SETTING_SCHEMAS = _setting_schemas()
SETTING_KEYS: tuple[str, ...] = tuple(_SETTING_SCHEMAS)
SETTING_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {key: _frozen(schema["default"]) for key, schema in _SETTING_SCHEMAS.items() if "default" in schema}
)
BUILD_INPUT_SETTINGS: tuple[str, ...] = tuple(
    key for key, schema in _SETTING_SCHEMAS.items() if schema.get("x-build-input", True) is not False
)
"""The settings whose value changes the wheel (the schema's ``x-build-input``; a setting not marked counts as one,
so a forgotten mark costs a rebuild, never a stale wheel)."""


@dataclass(frozen=True)
class MatrixEntry:
    """One build_matrix row as written."""

    arch: str
    cuda: str
    python: str
    torch: str
    cxx11_abi: str
    torch_vision: str = ""
    torch_audio: str = ""
    torch_index: str = ""

    @property
    def label(self) -> str:
        return f"{self.arch} {cuda_label(self.cuda)} py{self.python} torch{self.torch}"


@dataclass(frozen=True)
class Source:
    """Where a component's sources come from."""

    kind: str  # "git", "sdist" or "path"
    location: str  # clone URL, distribution name, or directory relative to the repository root
    submodules: bool | tuple[str, ...] = False
    """git: every submodule (True), none (False), or only these paths (each recursively)."""
    sha256: str | None = None

    @property
    def selected_submodules(self) -> tuple[str, ...] | None:
        """The only submodules a build gets, when the component names them (None: all or none)."""
        return self.submodules if isinstance(self.submodules, tuple) else None


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str) -> int:
    """A ``timeout(1)`` duration in seconds: ``90``, ``90s``, ``30m``, ``5h``, ``1d``."""
    unit = value[-1] if value[-1] in DURATION_UNITS else "s"
    number = value[:-1] if value[-1] in DURATION_UNITS else value
    return int(float(number) * DURATION_UNITS[unit])


@dataclass(frozen=True)
class Settings:
    """A component's build settings for one arch, overrides applied."""

    builder: str
    runs_on: str | tuple[str, ...]
    wheel_packages: tuple[str, ...]
    rehost: tuple[str, ...]
    """wheel_packages downloaded from upstream's index instead of built from the sources."""
    torch_cuda_arch_list: str | None
    arch_filter: bool
    requires_cudnn: bool
    max_jobs: int
    nvcc_threads: int
    shards: int
    """Parallel jobs the row's build is split into (ci/model/shards.py), assembled into one wheel by one more."""
    extra_env: Mapping[str, str]
    patches: tuple[str, ...]
    verify_wheel_archs: bool
    build_timeout: str
    job_timeout_minutes: int
    repair: str | None
    pass_env: tuple[str, ...]
    stage_pythons: bool
    """Build the first Python of each (arch, CUDA, torch) before the others, which start from the compiler
    cache it saved (ci/model/matrix.py's ``stages``)."""
    torch_pin: str
    """How a wheel that links torch pins it: ``minor``, ``exact`` or ``none`` (ci/checks/pin.py)."""
    build_path_exceptions: Mapping[str, str]
    """Shared objects (member path or glob) allowed to name build paths where an import reads them, with
    the reason (ci/checks/paths.py)."""
    extra_cubins: Mapping[str, str]
    """Cubins beyond ``torch_cuda_arch_list`` that the component's own build adds on purpose (``10.3a``), with the
    reason; the arch gate accepts them (ci/formats/archs.py's ``stray_archs``)."""
    smoke_test: tuple[str, ...]
    """Commands run after the checks in a fresh venv holding the row's torch and wheels (ci/building/smoke.py)."""

    @property
    def runs_on_labels(self) -> tuple[str, ...]:
        return (self.runs_on,) if isinstance(self.runs_on, str) else self.runs_on

    @cached_property
    def build_timeout_s(self) -> int:
        """``build_timeout`` in seconds (checked at load)."""
        return parse_duration(self.build_timeout)

    @cached_property
    def archs(self) -> ArchList | None:
        """``torch_cuda_arch_list`` parsed (checked at load); None when the component sets its own gencodes."""
        return parse_arch_list(self.torch_cuda_arch_list) if self.torch_cuda_arch_list else None


@dataclass(frozen=True)
class Component:
    name: str
    ref: str
    source: Source
    arches: tuple[str, ...] | None
    python_versions: tuple[str, ...] | None
    bundle_pythons: bool
    base: Mapping[str, Any] = field(repr=False)
    arch_overrides: Mapping[str, Mapping[str, Any]] = field(repr=False)

    def settings_for(self, arch: str) -> Settings:
        merged = merge_settings(self.base, self.arch_overrides.get(arch, {}))
        values = {key: _frozen(merged[key] if key in merged else SETTING_DEFAULTS[key]) for key in SETTING_KEYS}
        return Settings(**values)

    def builds(self, entry: MatrixEntry) -> bool:
        return (self.arches is None or entry.arch in self.arches) and (
            self.python_versions is None or entry.python in self.python_versions
        )

    def builds_of(self, build_matrix: tuple[MatrixEntry, ...]) -> list[tuple[MatrixEntry, tuple[str, ...]]]:
        """Each build of this component: the matrix entry that builds it, with the Pythons it bundles (none for a
        component without ``bundle_pythons``; else one build per (arch, CUDA, torch), by its newest Python)."""
        entries = [entry for entry in build_matrix if self.builds(entry)]
        if not self.bundle_pythons:
            return [(entry, ()) for entry in entries]
        groups: dict[tuple, list[MatrixEntry]] = {}
        for entry in entries:
            groups.setdefault((entry.arch, entry.cuda, entry.torch), []).append(entry)
        return [(max(group, key=lambda entry: version_key(entry.python)),
                 tuple(sorted({entry.python for entry in group}, key=version_key))) for group in groups.values()]


@dataclass(frozen=True)
class Versions:
    path: Path
    build_matrix: tuple[MatrixEntry, ...]
    components: Mapping[str, Component]
    reference_versions: Mapping[str, str]

    def component(self, name: str) -> Component:
        try:
            return self.components[name]
        except KeyError:
            raise ConfigError(
                f"{self.path.name}: unknown component '{name}'{_did_you_mean(name, self.components)}; "
                f"known components: {', '.join(sorted(self.components))}"
            ) from None


def merge_settings(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Override wins; mappings are merged key by key instead of replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def load(path: str | Path | None = None, *, repo_root: Path = REPO_ROOT, check_tree: bool = True) -> Versions:
    """Read, validate and type a versions file (default: the repository's versions.yaml).

    ``check_tree=False`` skips the rules that look at the working tree (builder
    scripts, patches, source directories): for a versions file of another
    commit, whose scripts the tree may no longer have.
    """
    path = Path(path) if path is not None else DEFAULT_VERSIONS
    data = _read_yaml(path)
    _check_schema(path, data)
    versions = _build(path, data)
    _check_semantics(versions, repo_root if check_tree else None)
    return versions


# --- reading -------------------------------------------------------------------------------------


# Bounds on what a versions file may make the loader do. The real versions.yaml is 7 KB, about 400
# values nested 6 deep; these leave room for many times that and keep every later walk (schema, typing,
# matrix) small. Composing is where they are cheap to keep: an alias is the value it names, shared, so
# a few hundred bytes of aliases (a "billion laughs") are billions of values to any walk after loading,
# and each level of nesting costs Python frames (a deep enough one ends in RecursionError).
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 20
MAX_VALUES = 20_000
"""Values (scalars, lists, mappings, keys included) with every alias counted as the values it names."""


class _TooLarge(yaml.YAMLError):
    """The document exceeds one of the bounds above at ``line``; ``problem`` and ``fix`` make the message."""

    def __init__(self, problem: str, fix: str, line: int) -> None:
        super().__init__(problem)
        self.problem, self.fix, self.line = problem, fix, line


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last silently) and documents
    nested deeper than MAX_DEPTH or holding more than MAX_VALUES values once aliases are expanded."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0
        self._expanded: dict[str, int] = {}  # anchor -> how many values each alias of it stands for
        self._open: set[str] = set()  # anchors whose value is still being composed

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else 0
        anchor = event.anchor
        if isinstance(event, yaml.AliasEvent):
            if anchor in self._open:
                raise _TooLarge(f"alias *{anchor} is inside the value it names", "remove the alias", line)
            self._count(self._expanded.get(anchor or "", 1), line)  # an undefined one: the base class says so
            return super().compose_node(parent, index)
        if self._depth == MAX_DEPTH:
            raise _TooLarge(f"nested more than {MAX_DEPTH} levels", "a versions file needs far fewer: flatten it", line)
        before = self._values
        self._count(1, line)
        self._depth += 1
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor or "")
        if anchor is not None:
            self._expanded[anchor] = self._values - before
        return node

    def _count(self, values: int, line: int) -> None:
        self._values += values
        if self._values > MAX_VALUES:
            raise _TooLarge(f"more than {MAX_VALUES} values with aliases expanded",
                            "a versions file needs far fewer: write values out instead of repeating aliases", line)


def _construct_unique_mapping(loader: _BoundedLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                None, None, f"a {type(key).__name__} cannot be a mapping key", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}' (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _read_yaml(path: Path) -> Any:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)  # never more: the file may be huge, or endless
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found; pass an existing versions file (WHEELHOUSE_VERSIONS)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc}); it must be a UTF-8 YAML file") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path.name}: larger than {MAX_FILE_BYTES >> 20} MiB; a versions file needs far less: "
                          "remove what is not build configuration")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc}); it must be a UTF-8 YAML file") from None
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass
    except _TooLarge as exc:
        raise ConfigError(f"{path.name}: {exc.problem} at line {exc.line}; {exc.fix}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path.name}: invalid YAML at {where}: {problem}; fix the syntax there") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path.name}: the top level must be a mapping with build_matrix and components")
    return data


# --- schema pass ---------------------------------------------------------------------------------


def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _key_path(parts) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _did_you_mean(word: str, candidates) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


_TYPE_NAMES = {"string": "a string", "integer": "an integer", "boolean": "true or false", "array": "a list",
               "object": "a mapping", "null": "null", "number": "a number"}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string '{_shorten(value)}'"
    if isinstance(value, list):
        return "a list"
    return "a mapping"


def _schema_message(error: jsonschema.ValidationError) -> tuple[list, str]:  # noqa: C901 - one flat case per jsonschema validator
    """(key path parts, 'problem; fix') for one jsonschema error."""
    parts = list(error.absolute_path)
    schema = error.schema
    value = error.instance
    kind = error.validator
    if kind == "additionalProperties" and isinstance(value, dict):
        known = sorted(schema.get("properties", {}))
        extra = sorted(set(value) - set(known))
        key = extra[0]
        return [*parts, key], f"unknown key{_did_you_mean(key, known)}; known keys: {', '.join(known)}"
    if kind == "required":
        missing = [name for name in error.validator_value if name not in value]
        return parts, f"missing required key '{missing[0]}'; add it (see versions.schema.json)"
    if kind == "type":
        types: list[str] = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        wanted = " or ".join(_TYPE_NAMES.get(w, w) for w in types)
        hint = ""
        if (parts and parts[-1] in ("python",)) or (len(parts) >= 2 and parts[-2] == "python_versions"):
            hint = f'; quote it: "{value}" (YAML reads 3.10 as the number 3.1)'
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and "string" in str(error.validator_value):
            hint = f'; quote it: "{value}"'
        return parts, f"expected {wanted}, got {_describe(value)}{hint}"
    if kind == "enum":
        allowed = ", ".join(str(v) for v in error.validator_value)
        return parts, f"{_describe(value)} is not allowed{_did_you_mean(value, error.validator_value)}; use one of: {allowed}"
    if kind == "pattern":
        return parts, f"{_describe(value)} is malformed; {schema.get('description', 'expected pattern ' + schema['pattern'])}"
    if kind in ("minItems", "minProperties"):
        return parts, "must not be empty; list at least one entry or remove the key"
    if kind == "minLength":
        return parts, "must not be an empty string"
    if kind == "maxLength":
        return parts, f"{_describe(value)} is longer than {error.validator_value} characters; shorten it"
    if kind == "minimum":
        return parts, f"{value} is too small; the minimum is {error.validator_value}"
    if kind == "maximum":
        return parts, f"{value} is too large; the maximum is {error.validator_value}"
    if kind == "oneOf" and parts and parts[-1] == "source":
        return parts, "name exactly one of 'git' (a clone URL), 'sdist' (a distribution name) or 'path' (a directory)"
    if kind in ("anyOf", "oneOf", "const"):
        description = schema.get("description")
        return parts, f"{_describe(value)} is not valid" + (f"; {description}" if description else "")
    if kind == "propertyNames":
        return parts, f"invalid name: {error.message}"
    return parts, error.message


def _check_schema(path: Path, data: Any) -> None:
    validator = jsonschema.Draft202012Validator(_schema())
    errors = list(validator.iter_errors(data))
    if not errors:
        return
    # The deepest error at the earliest path is the most specific one to show.
    error = jsonschema.exceptions.best_match(errors)
    if "propertyNames" in error.absolute_schema_path:
        # jsonschema reports the parent mapping; name the offending key instead.
        parts = list(error.absolute_path)
        bad = error.instance
        raise ConfigError(
            f"{path.name}: {_key_path([*parts, _shorten(str(bad))])}: invalid name{_did_you_mean(bad, _name_choices(parts))}; "
            f"{_name_rule(parts)}"
        )
    parts, message = _schema_message(error)
    raise ConfigError(f"{path.name}: {_key_path(parts)}: {message}")


def _name_choices(parts: list) -> list[str]:
    return ["x86_64", "aarch64"] if parts and parts[-1] == "arch_overrides" else []


def _name_rule(parts: list) -> str:
    if parts and parts[-1] == "arch_overrides":
        return "arch_overrides keys are arches: x86_64 or aarch64"
    if parts and parts[-1] == "extra_env":
        return "environment variable names are letters, digits and '_', not starting with a digit, at most 128 characters"
    if parts and parts[-1] == "verl_reference_versions":
        return "names are at most 100 characters"
    if parts and parts[-1] == "extra_cubins":
        return "extra_cubins keys are exact CUDA targets, e.g. 10.3a or sm_103a"
    if parts and parts[-1] == "build_path_exceptions":
        return ("build_path_exceptions keys are member paths or globs: letters, digits and ._*?/[]-, at most 200 "
                "characters")
    return "component names are lower-case letters, digits and '-', at most 64 characters"


# --- typing --------------------------------------------------------------------------------------


def _build(path: Path, data: dict) -> Versions:
    entries = tuple(
        MatrixEntry(
            arch=row["arch"],
            cuda=row["cuda"],
            python=row["python"],
            torch=row["torch"],
            cxx11_abi=row["cxx11_abi"],
            torch_vision=row.get("torch_vision", ""),
            torch_audio=row.get("torch_audio", ""),
            torch_index=row.get("torch_index", ""),
        )
        for row in data["build_matrix"]
    )
    components = {}
    for name, raw in data["components"].items():
        src = raw["source"]
        if "git" in src:
            wanted = src.get("submodules", False)
            source = Source("git", src["git"], tuple(wanted) if isinstance(wanted, list) else bool(wanted))
        elif "sdist" in src:
            source = Source("sdist", src["sdist"], sha256=src.get("sha256"))
        else:
            source = Source("path", src["path"])
        components[name] = Component(
            name=name,
            ref=str(raw["ref"]),
            source=source,
            arches=tuple(raw["arches"]) if "arches" in raw else None,
            python_versions=tuple(raw["python_versions"]) if "python_versions" in raw else None,
            bundle_pythons=bool(raw.get("bundle_pythons", False)),
            base={key: raw[key] for key in SETTING_KEYS if key in raw},
            arch_overrides={arch: dict(values) for arch, values in raw.get("arch_overrides", {}).items()},
        )
    return Versions(path, entries, components, dict(data.get("verl_reference_versions", {})))


# --- semantic pass -------------------------------------------------------------------------------


def _check_semantics(versions: Versions, repo_root: Path | None) -> None:  # noqa: C901 - a flat list of independent rules
    name = versions.path.name
    seen: dict[tuple, int] = {}
    for index, entry in enumerate(versions.build_matrix):
        key = (entry.arch, entry.cuda, entry.python, entry.torch)
        if key in seen:
            raise ConfigError(
                f"{name}: build_matrix[{index}]: duplicates build_matrix[{seen[key]}] ({entry.label}); remove one of them"
            )
        seen[key] = index
    matrix_arches = sorted({e.arch for e in versions.build_matrix})
    matrix_pythons = sorted({e.python for e in versions.build_matrix}, key=version_key)

    for component in versions.components.values():
        where = f"{name}: components.{component.name}"
        _check_not_option(f"{where}.source.{component.source.kind}", component.source.location)
        if component.source.kind == "git":
            _check_clone_url(f"{where}.source.git", component.source.location)
        _check_ref(f"{where}.ref", versions, component)
        if component.source.kind == "path":
            _check_inside_repository(f"{where}.source.path", component.source.location, repo_root)
        if repo_root and component.source.kind == "path" and not (repo_root / component.source.location).is_dir():
            raise ConfigError(
                f"{where}.source.path: {component.source.location} is not a directory of the repository; fix the path"
            )
        for arch in component.arch_overrides:
            if arch not in matrix_arches:
                raise ConfigError(
                    f"{where}.arch_overrides.{arch}: arch not in build_matrix ({', '.join(matrix_arches)}); "
                    "remove the override or add a build_matrix row for that arch"
                )
        for index, arch in enumerate(component.arches or ()):
            if arch not in matrix_arches:
                raise ConfigError(
                    f"{where}.arches[{index}]: '{arch}' is not an arch of build_matrix ({', '.join(matrix_arches)}); "
                    "remove it or add a build_matrix row for it"
                )
        for index, python in enumerate(component.python_versions or ()):
            if python not in matrix_pythons:
                raise ConfigError(
                    f"{where}.python_versions[{index}]: Python '{python}' is not in build_matrix "
                    f"({', '.join(matrix_pythons)}); remove it or add a build_matrix row for it"
                )
        rows = [entry for entry in versions.build_matrix if component.builds(entry)]
        if not rows:
            raise ConfigError(f"{where}: builds no build_matrix row; widen its arches or python_versions")
        for arch in sorted({entry.arch for entry in rows}):
            settings = component.settings_for(arch)
            if arch != "x86_64" and any(label.strip().lower() == "self-hosted" for label in settings.runs_on_labels):
                runs_on_key = "arch_overrides." + arch + ".runs_on" if "runs_on" in component.arch_overrides.get(arch, {}) else "runs_on"
                raise ConfigError(
                    f"{where}.{runs_on_key}: the {arch} build points at a self-hosted runner (the self-hosted machine is x86_64); "
                    f"set arch_overrides.{arch}.runs_on to a GitHub-hosted runner such as ubuntu-24.04-arm"
                )
            if settings.arch_filter and not settings.torch_cuda_arch_list:
                raise ConfigError(
                    f"{where}.arch_filter: needs torch_cuda_arch_list to say which archs to keep; set it or drop arch_filter"
                )
            override = component.arch_overrides.get(arch, {})
            arch_list_key = (f"arch_overrides.{arch}.torch_cuda_arch_list" if "torch_cuda_arch_list" in override
                             else "torch_cuda_arch_list")
            _check_arch_list(f"{where}.{arch_list_key}", settings.torch_cuda_arch_list)
            extra_key = f"arch_overrides.{arch}.extra_cubins" if "extra_cubins" in override else "extra_cubins"
            _check_extra_cubins(f"{where}.{extra_key}", settings)
            rehost_key = f"arch_overrides.{arch}.rehost" if "rehost" in override else "rehost"
            _check_rehost(f"{where}.{rehost_key}", settings, component.name)
            patches_key = f"arch_overrides.{arch}.patches" if "patches" in override else "patches"
            for index, patch in enumerate(settings.patches):
                _check_inside_repository(f"{where}.{patches_key}[{index}]", patch, repo_root)
            if repo_root is None:
                continue
            builder_key = f"arch_overrides.{arch}.builder" if "builder" in override else "builder"
            if not (repo_root / "build_scripts" / f"{settings.builder}.sh").is_file():
                raise ConfigError(
                    f"{where}.{builder_key}: build_scripts/{settings.builder}.sh does not exist; "
                    "name an existing builder or add that script"
                )
            _check_shards(where, component, arch, settings, repo_root)
            for index, patch in enumerate(settings.patches):
                if not (repo_root / patch).is_file():
                    raise ConfigError(
                        f"{where}.{patches_key}[{index}]: {patch} does not exist; give a path relative to the repository root"
                    )


# The clone URLs a component may name, an allow-list: git also takes "<transport>::<address>", which
# runs a remote helper (fd::0 waits on a file descriptor for ever, ext:: runs a command), and other
# schemes (git://, http://) that do not authenticate the server.
_HOST = r"[A-Za-z0-9][A-Za-z0-9.-]*"
_USER = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_CLONE_URL = re.compile(
    rf"""(?: https://{_HOST}(?::[0-9]+)?/               # https://host[:port]/owner/repo.git
           | ssh://(?:{_USER}@)?{_HOST}(?::[0-9]+)?/    # ssh://[user@]host[:port]/path
           | {_USER}@{_HOST}:(?!-)                      # git@host:owner/repo.git
           | file:/// | \.{{0,2}}/                      # a local repository: file:///path, /path, ./path, ../path
        )\S+""",
    re.VERBOSE,
)


def _check_shards(where: str, component: Component, arch: str, settings: Settings, repo_root: Path) -> None:
    """``shards`` above 1 only for a builder that declares it builds by shards (ci/model/shards.py)."""
    if settings.shards <= 1 or builds_by_shards(repo_root / "build_scripts" / f"{settings.builder}.sh"):
        return
    key = f"arch_overrides.{arch}.shards" if "shards" in component.arch_overrides.get(arch, {}) else "shards"
    raise ConfigError(
        f"{where}.{key}: {settings.shards} shards, but build_scripts/{settings.builder}.sh does not build by shards "
        f"(it has no '{BUILDER_DECLARATION}' line): each shard job would run the whole build and leave no shard; "
        "set shards: 1, or make the builder build one shard (WHEELHOUSE_SHARD) and assemble them (WHEELHOUSE_ASSEMBLE)"
    )


def _check_clone_url(where: str, url: str) -> None:
    if not _CLONE_URL.fullmatch(url):
        raise ConfigError(
            f"{where}: '{_shorten(url)}' is not a clone URL git may be given here; write https://host/owner/repo.git, "
            "ssh://host/path, git@host:owner/repo.git or a local repository (/path, ./path, ../path or "
            "file:///path)"
        )


def _check_ref(where: str, versions: Versions, component: Component) -> None:
    """The ref reaches git (as a branch, tag or commit) and names the release tags: both must be names
    git accepts, and the tags short enough for the file names made from them."""
    ref = component.ref
    _check_not_option(where, ref)
    if not any(c.isalnum() for c in ref):
        raise ConfigError(f"{where}: '{ref}' names no branch, tag or commit; write e.g. v1.2.0 or main")
    problem = ref_format_problem(ref)
    if problem:
        raise ConfigError(f"{where}: '{_shorten(ref)}' {problem}, which git refuses in a branch or tag name; "
                          "write the ref as git shows it")
    for entry, bundle in component.builds_of(versions.build_matrix):
        tag = release_tag(component.name, ref, entry.cuda, "-".join(bundle) or entry.python, entry.torch)
        problem = tag_problem(tag)
        if problem:
            raise ConfigError(f"{where}: makes the release tag '{_shorten(tag)}', which {problem}; "
                              "shorten the ref (or the component name)")


def _shorten(text: str, limit: int = 80) -> str:
    """``text`` as a message shows it: a long value by its start and its length, so the line stays short."""
    return text if len(text) <= limit else f"{text[:limit - 20]}…({len(text)} characters)"


def _check_not_option(where: str, value: str) -> None:
    """git and pip read a leading '-' as an option (``--upload-pack=<command>`` runs a command)."""
    if value.startswith("-"):
        raise ConfigError(f"{where}: '{value}' starts with '-', which git and pip would read as an option; remove the '-'")


def _check_inside_repository(where: str, value: str, repo_root: Path | None) -> None:
    """A repository-relative path must stay inside the repository, symlinks included."""
    path = Path(value)
    outside = path.is_absolute() or ".." in path.parts
    if not outside and repo_root is not None:
        outside = not (repo_root / path).resolve().is_relative_to(repo_root.resolve())
    if outside:
        raise ConfigError(f"{where}: {value} is outside the repository; give a path relative to the repository root")


def _check_rehost(where: str, settings: Settings, component: str) -> None:
    """Only a wheel the component publishes can be rehosted: a name outside wheel_packages is a typo."""
    published = settings.wheel_packages or (component,)
    for index, name in enumerate(settings.rehost):
        if canonicalize_name(name) not in {canonicalize_name(p) for p in published}:
            raise ConfigError(f"{where}[{index}]: {name} is not one of the wheels the component publishes "
                              f"({', '.join(published)}); rehost only one of them, or add it to wheel_packages")


def _check_extra_cubins(where: str, settings: Settings) -> None:
    """Each extra cubin an exact target the gate would otherwise refuse, beside a list the gate reads."""
    if not settings.extra_cubins:
        return
    if settings.archs is None:
        raise ConfigError(f"{where}: the arch gate reads it only beside torch_cuda_arch_list; set that list or drop "
                          "extra_cubins")
    asked = {arch.base for arch in settings.archs.archs}
    for token in settings.extra_cubins:
        try:
            arch = parse_arch(token)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if arch.base in asked:
            raise ConfigError(f"{where}: {token} is accepted already, as a flavour of {arch.base} in "
                              f"torch_cuda_arch_list ({settings.torch_cuda_arch_list}); remove it from extra_cubins")


def _check_arch_list(where: str, value: str | None) -> None:
    """The list nvcc and the arch check will read; a bad token must fail now, not after the build."""
    if value is None:
        return
    try:
        parsed = parse_arch_list(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not parsed.archs:
        raise ConfigError(f"{where}: names no CUDA arch; write e.g. \"8.0;9.0\", or null when the component sets its own")
