"""The test suite's own layout rules (docs/testing.md, "Running the tests").

- A test module imports helpers from tests/support/ only: never from a conftest module, nor from
  another test module (whose helpers would run its tests' imports, and tie the two together).
- tests/support/ imports nothing else under tests/.
- A conftest defines fixtures and hooks only; what tests import lives in tests/support/.
- Every test lives in a tier folder, in packages (an `__init__.py` in every folder), so that two
  test modules may share a base name.
- The serial, PostgreSQL and slowest-first lists of tests/support/suite.py name tests that exist.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import suite

TESTS = suite.TESTS
SOURCES = sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    """The dotted name of a file under tests/ (`tests.integration.api.test_api_keys`)."""
    parts = path.relative_to(TESTS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = (package or module_name(path)).split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from tests.integration import test_x` imports a module too.
            found += [(node.lineno, base)]
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def is_test_or_conftest(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last == "conftest" or last.startswith("test_")


def test_no_module_imports_from_a_conftest_or_a_test_module() -> None:
    offences = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in SOURCES
        for line, module in imported(path)
        if is_test_or_conftest(module) and (module.startswith("tests") or "." not in module)
    ]
    assert offences == [], "import helpers from tests/support/ instead:\n" + "\n".join(offences)


def test_support_imports_nothing_else_under_tests() -> None:
    offences = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in SOURCES
        if path.parent == TESTS / "support"
        for line, module in imported(path)
        if module.split(".")[0] == "tests" and not module.startswith("tests.support")
    ]
    assert offences == [], "\n".join(offences)


def _is_fixture_or_hook(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    if node.name.startswith("pytest_"):
        return True
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
    return False


def test_conftests_define_fixtures_and_hooks_only() -> None:
    offences = []
    for path in SOURCES:
        if path.name != "conftest.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for i, node in enumerate(tree.body):
            if isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_fixture_or_hook(
                node
            ):
                continue
            offences.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert offences == [], "move these to tests/support/:\n" + "\n".join(offences)


def test_every_test_module_is_in_a_tier_folder_of_packages() -> None:
    for path in SOURCES:
        rel = path.relative_to(TESTS)
        if path.name.startswith("test_"):
            assert rel.parts[0] in suite.TIERS, f"{rel}: not in a tier folder"
        for folder in [TESTS, *path.parents]:
            if folder == TESTS.parent:
                break
            assert (folder / "__init__.py").exists(), f"{folder}: no __init__.py"


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in tree.body
    )


@pytest.mark.parametrize("entry", [*suite.SERIAL, *suite.POSTGRES, *suite.SLOWEST_FIRST])
def test_each_listed_test_exists(entry: str) -> None:
    where, _, name = entry.partition("::")
    path = TESTS / where
    assert path.exists(), f"{entry}: no such file or folder under tests/"
    if name:
        function = name.partition("[")[0]  # one parametrization: `test[id]`
        assert _defines(path, function), f"{entry}: {where} defines no {function}"
