"""Dagster's internals stay behind one adapter module, and what the project builds on them still
exists on the installed Dagster (scripts/test_newest_dagster.sh runs this on the newest release)."""

import ast
import inspect
from pathlib import Path

import pytest

import vision_rag_pipeline
from vision_rag_pipeline.defs import compute_logs, dagster_internals, local_storage

PACKAGE = Path(vision_rag_pipeline.__file__).parent
ADAPTER = Path(dagster_internals.__file__)
# The modules whose classes subclass the adapter's: each override is marked `@override`.
PLUGINS = [local_storage, compute_logs]


def _private_dagster_imports(path: Path) -> list[str]:
    """Every `dagster._…` module `path` imports, by `import`, `from … import` or importlib."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            # `from dagster import _check` names a private module too
            names = [module] if module.startswith("dagster._") else [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]  # importlib.import_module("dagster._…"), a mock.patch target
        else:
            continue
        found += [name for name in names if name.startswith("dagster._")]
    return found


def test_no_module_but_the_adapter_imports_dagster_internals() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): imports
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ADAPTER and (imports := _private_dagster_imports(path))
    }
    assert offenders == {}
    assert _private_dagster_imports(ADAPTER), "the adapter is where they are"


def test_the_scan_sees_each_form_of_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import dagster._core.events\n"
        "from dagster._serdes import ConfigurableClass\n"
        "from dagster import _check\n"
        "import importlib\n"
        "importlib.import_module('dagster._utils')\n"
        "import dagster\n"
        "from dagster import Field\n"
    )
    assert _private_dagster_imports(sample) == [
        "dagster._core.events",
        "dagster._serdes",
        "dagster._check",
        "dagster._utils",
    ]


@pytest.mark.parametrize("name", dagster_internals.__all__)
def test_each_adapter_name_resolves_on_the_installed_dagster(name: str) -> None:
    assert getattr(dagster_internals, name) is not None


def _overrides(attribute: object) -> bool:
    """Whether `attribute` (a function, or one wrapped by classmethod, property, contextmanager) is
    marked `@override`."""
    seen = attribute
    while seen is not None:
        if getattr(seen, "__override__", False):
            return True
        seen = next(
            (getattr(seen, a) for a in ("__func__", "fget", "func", "__wrapped__") if hasattr(seen, a)),
            None,
        )
    return False


def _plugin_classes() -> list[type]:
    return [
        cls
        for module in PLUGINS
        for cls in vars(module).values()
        if inspect.isclass(cls) and cls.__module__ == module.__name__
    ]


@pytest.mark.parametrize("cls", _plugin_classes(), ids=lambda cls: cls.__name__)
def test_every_override_still_overrides_a_dagster_method(cls: type) -> None:
    """A method Dagster renames in a release would leave ours never called: the storage would go on
    working, slower or without our fix, and no other test would notice. So each method marked
    `@override` must exist on a base class, and each method that shadows a base's must be marked."""
    for name, attribute in vars(cls).items():
        if name.startswith("__") or name == "_abc_impl":
            continue
        on_a_base = any(name in vars(base) for base in cls.__mro__[1:])
        assert on_a_base == _overrides(attribute), f"{cls.__name__}.{name}: " + (
            "marked @override, but no base class has it" if not on_a_base else "overrides, unmarked"
        )
