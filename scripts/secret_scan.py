"""Secret scan for `make lint` (TEST-PLAN SE-2 and SE-6); offline, and it never writes.

1. detect-secrets over every file git knows of (tracked, and new ones not ignored), against
   `.secrets.baseline`: a finding the baseline does not hold fails. The baseline holds only
   audited fakes (test canaries, documentation examples); to accept a new one, regenerate it
   (`uv run detect-secrets scan --exclude-files '^uv\\.lock$' > .secrets.baseline`) and audit
   it (`uv run detect-secrets audit .secrets.baseline`). Findings are matched by file, type
   and secret, not by line, so edits elsewhere in a file never fail the scan.
2. What the browser is served (`bullpen/web/static`, `bullpen/web/templates`) must not hold
   anything shaped like a credential at all, baseline or not: a Bullpen API key (`bp_…`), an
   OpenAI-style key (`sk-…`), a private key block, an AWS access key id, a JWT.

Usage: `python scripts/secret_scan.py [--served-only DIR...]`; exit status 1 on findings.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

from detect_secrets.core import baseline
from detect_secrets.core.secrets_collection import SecretsCollection
from detect_secrets.settings import get_settings

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ".secrets.baseline"
# Verifying a finding means asking the issuer's API over the network: never.
VERIFY_FILTER = "detect_secrets.filters.common.is_ignored_due_to_verification_policies"
SERVED = (ROOT / "bullpen" / "web" / "static", ROOT / "bullpen" / "web" / "templates")
SHAPES = {
    "Bullpen API key": re.compile(r"\bbp_[A-Za-z0-9_-]{16,}"),
    "OpenAI-style key": re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "JWT": re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
}


def credential_shapes(*roots: Path) -> list[str]:
    """`path:line: kind` for every credential-shaped string in the files under `roots`."""
    found = []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            text = path.read_text("utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), 1):
                for kind, shape in SHAPES.items():
                    if shape.search(line):
                        found.append(f"{path}:{number}: {kind}")
    return found


def new_secrets(root: Path = ROOT) -> list[str]:
    """`path:line: type` for detect-secrets findings in the git work tree at `root` that its
    baseline does not hold."""
    # detect-secrets names files relative to the working directory.
    with contextlib.chdir(root):
        known = baseline.load(baseline.load_from_file(BASELINE), BASELINE)
        get_settings().disable_filters(VERIFY_FILTER)
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],  # noqa: S607
            check=True,
            capture_output=True,
        ).stdout.decode()
        files = [f for f in listed.split("\0") if f and f != BASELINE and Path(f).is_file()]
        scanned = SecretsCollection()
        scanned.scan_files(*files)
        fresh = scanned - known
    return sorted(f"{name}:{secret.line_number}: {secret.type}" for name, secret in fresh)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--served-only"]:
        found = credential_shapes(*(Path(a) for a in argv[1:]))
    else:
        found = [f"{line} (not in .secrets.baseline)" for line in new_secrets()]
        found += credential_shapes(*SERVED)
    for line in found:
        print(line)
    if found:
        print(f"secret scan: {len(found)} finding(s); see scripts/secret_scan.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
