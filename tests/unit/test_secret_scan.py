"""SE-2 and SE-6: the secret scan `make lint` runs (scripts/secret_scan.py).

What the browser is served holds nothing shaped like a credential; the shapes it looks for are
found when planted; and the repository scan fails on a secret its baseline does not hold, and
passes once the baseline (audited) holds it. All offline: detect-secrets never verifies.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bullpen.domain import tokens

ROOT = Path(__file__).resolve().parents[2]


def _load_scan() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "secret_scan", ROOT / "scripts" / "secret_scan.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scan = _load_scan()


def test_what_the_browser_is_served_holds_no_credential_shapes() -> None:
    served = scan.SERVED
    assert all(root.is_dir() for root in served)
    assert any(root.name == "static" and any(root.iterdir()) for root in served)
    assert scan.credential_shapes(*served) == []


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# Built at run time, so this file holds none of them literally (the repository scan would
# rightly flag it).
CANARIES = {
    "Bullpen API key": tokens.new_api_key(),
    "OpenAI-style key": "sk-canary-" + "Zq8" * 8,
    "private key": "-----BEGIN RSA " + "PRIVATE KEY-----",
    "AWS access key id": "AKIA" + "Q7ZX" * 4,
    "JWT": ".".join(
        _b64(part) for part in (b'{"alg":"HS256"}', b'{"sub":"canary"}', b"signature-canary")
    ),
}


@pytest.mark.parametrize("kind", sorted(CANARIES))
def test_a_credential_planted_in_an_asset_is_found(tmp_path: Path, kind: str) -> None:
    static = tmp_path / "static"
    static.mkdir()
    (static / "clean.js").write_text("const prefix = 'bp_';\n")
    (static / "app.js").write_text(f"// build\nconst k = '{CANARIES[kind]}';\n")
    found = scan.credential_shapes(static)
    assert found == [f"{static / 'app.js'}:2: {kind}"]
    script = ROOT / "scripts" / "secret_scan.py"
    result = subprocess.run(
        [sys.executable, str(script), "--served-only", str(static)], capture_output=True
    )
    assert result.returncode == 1, result


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_the_repository_scan_fails_on_a_secret_its_baseline_lacks(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "clean.py").write_text("x = 1\n")
    empty = {"version": "1.5.0", "plugins_used": [], "filters_used": [], "results": {}}
    with (ROOT / scan.BASELINE).open() as f:  # the project's plugins and filters
        project = json.load(f)
    empty["plugins_used"] = project["plugins_used"]
    empty["filters_used"] = project["filters_used"]
    (repo / scan.BASELINE).write_text(json.dumps(empty))
    assert scan.new_secrets(repo) == []

    # A new, untracked file: what a commit is about to add.
    (repo / "config.py").write_text(f'\n\nAWS_ACCESS_KEY_ID = "{CANARIES["AWS access key id"]}"\n')
    found = scan.new_secrets(repo)
    assert found and all(line.startswith("config.py:3: ") for line in found), found

    # Audited into the baseline it passes, wherever the line moves to later.
    baselined = dict(empty)
    secrets = subprocess.run(
        [sys.executable, "-m", "detect_secrets", "scan", "--no-verify", "config.py"],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    baselined["results"] = json.loads(secrets)["results"]
    (repo / scan.BASELINE).write_text(json.dumps(baselined))
    (repo / "config.py").write_text(f'AWS_ACCESS_KEY_ID = "{CANARIES["AWS access key id"]}"\n')
    assert scan.new_secrets(repo) == []
