"""Which modules a Bullpen process has loaded, read from outside while it runs.

`listing_env(folder)` puts a `sitecustomize.py` in `folder` and returns the environment that
makes every Python process started with it import that file first; on SIGUSR2 such a process
writes the names in its `sys.modules` to `folder/modules-<pid>.txt`. `loaded_modules` sends
the signal and reads the file.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_SITECUSTOMIZE = """
import os, signal, sys

def _list(*_args, folder=os.environ["BULLPEN_TEST_MODULES_DIR"]):
    path = os.path.join(folder, f"modules-{os.getpid()}.txt")
    with open(path + ".part", "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
    os.replace(path + ".part", path)

signal.signal(signal.SIGUSR2, _list)
"""


def listing_env(folder: Path) -> dict[str, str]:
    """The environment variables that make a process list its modules on SIGUSR2."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return {"PYTHONPATH": str(folder), "BULLPEN_TEST_MODULES_DIR": str(folder)}


def loaded_modules(pid: int, folder: Path, timeout_s: float = 10.0) -> set[str]:
    """The modules process `pid` (started with `listing_env(folder)`) has loaded by now."""
    listed = folder / f"modules-{pid}.txt"
    listed.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout_s
    while not listed.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not list its modules")
        time.sleep(0.05)
    return set(listed.read_text().split())
