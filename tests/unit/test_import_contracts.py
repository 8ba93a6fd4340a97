"""The layering rules in pyproject.toml are checked by import-linter, and they can fail.

`make lint` runs `lint-imports` on the tree. These tests run it on a copy of the package, once
as it is and once with one forbidden import planted, so a contract that never fires (a typo in
a module name, a contract dropped from the file) shows up here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run(
        [str(exe), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(
        ROOT / "bullpen", root / "bullpen", ignore=shutil.ignore_patterns("__pycache__", "web")
    )
    return root


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = _lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert f"Contracts: {len(declared['contracts'])} kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("bench/__init__.py", "import bullpen.store.base", "the bench measures from outside"),
        ("domain/__init__.py", "import sqlalchemy", "domain (and the error vocabulary"),
        ("store/__init__.py", "import bullpen.services.tasks", "store never calls up"),
        ("services/__init__.py", "import fastapi", "only api/ imports FastAPI"),
        ("gateway/__init__.py", "import bullpen.store.base", "gateway never imports store"),
        ("agents/__init__.py", "import bullpen.api.deps", "agents never import store or api"),
        ("security/__init__.py", "import bullpen.services.auth", "security is a leaf"),
        ("queue/__init__.py", "import bullpen.bench.report", "nothing but the CLI imports"),
        ("api/schemas/__init__.py", "import bullpen.api.routes", "API schemas never import"),
        ("simulator/__init__.py", "import bullpen.gateway.router", "the simulator is a provider"),
        ("streams/__init__.py", "import bullpen.api.eventstream", "services never import the"),
        ("cli/__init__.py", "import starlette.responses", "the CLI reaches FastAPI only"),
        ("telemetry/__init__.py", "import bullpen.store.base", "telemetry reads the domain"),
    ],
)
def test_a_planted_import_breaks_its_contract(
    tree: Path, module: str, planted: str, contract: str
) -> None:
    path = tree / "bullpen" / module
    original = path.read_text()
    path.write_text(original + f"\n{planted}  # planted by the test\n")
    try:
        result = _lint_imports(tree)
    finally:
        path.write_text(original)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if line.endswith(" BROKEN")]
    assert any(line.startswith(contract) for line in broken), result.stdout
