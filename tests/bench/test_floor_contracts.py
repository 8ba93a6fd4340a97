"""The floor is the bench's one module allowed FastAPI and SQLAlchemy, and only it.

pyproject.toml's two bench contracts make a named exception (`ignore_imports`) for
`bullpen.bench.floor`; an import of either anywhere else in the bench must still break them.
`lint-imports` runs on a copy of the package with one such import planted (as
tests/unit/test_import_contracts.py does for the other contracts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


@pytest.mark.parametrize(
    ("planted", "contract"),
    [
        ("import fastapi", "the bench imports FastAPI or Starlette only in its floor"),
        ("import starlette.responses", "the bench imports FastAPI or Starlette only in its floor"),
        ("import sqlalchemy", "the bench imports SQLAlchemy only in its floor"),
    ],
)
def test_fastapi_or_sqlalchemy_elsewhere_in_the_bench_breaks_its_contract(
    tmp_path: Path, planted: str, contract: str
) -> None:
    shutil.copytree(
        ROOT / "bullpen", tmp_path / "bullpen", ignore=shutil.ignore_patterns("__pycache__", "web")
    )
    report = tmp_path / "bullpen" / "bench" / "report.py"
    report.write_text(report.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if "BROKEN" in line]
    assert any(line.startswith(contract) for line in broken), result.stdout
    assert "-   bullpen.bench.report -> " in result.stdout  # the planted line, not the floor
