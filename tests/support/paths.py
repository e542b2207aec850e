"""Where the repository and the parts the tests read are."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

__all__ = ["DEPLOY", "REPO", "SPARK", "nsq_bin"]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SPARK = REPO / "spark"


@cache
def nsq_bin() -> Path | None:
    """The folder of nsq 1.3.0's own programs (``$NSQ_BIN``, or what ``shared/nsq/bin`` beside
    the checkout unpacks), or None when neither is there (a user's fresh clone)."""
    if os.environ.get("NSQ_BIN"):
        return Path(os.environ["NSQ_BIN"])
    for base in (REPO.parent, REPO.parent.parent):
        script = base / "shared" / "nsq" / "bin"
        if script.is_file():
            # the script unpacks into ~/.cache, which a fresh machine may not have yet
            (Path.home() / ".cache").mkdir(parents=True, exist_ok=True)
            found = subprocess.run([str(script)], capture_output=True, text=True, check=False, timeout=300)
            if found.returncode == 0 and (Path(found.stdout.strip()) / "nsqd").is_file():
                return Path(found.stdout.strip())
    return None
