"""Where the repository and the parts the tests read are."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["DEPLOY", "REPO", "SPARK", "nsq_programs"]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SPARK = REPO / "spark"


def nsq_programs() -> Path | None:
    """The folder of nsq 1.3.0's own programs (nsqd, ...), or None when this machine has none.

    ``$NSQ_BIN`` if set, else what ``shared/nsq/bin`` beside the checkout (or beside its
    worktree folder) prints.
    """
    if os.environ.get("NSQ_BIN"):
        return Path(os.environ["NSQ_BIN"])
    for script in (REPO.parent / "shared" / "nsq" / "bin", REPO.parent.parent / "shared" / "nsq" / "bin"):
        if script.is_file():
            done = subprocess.run([str(script)], capture_output=True, text=True, timeout=120)
            if done.returncode == 0 and (Path(done.stdout.strip()) / "nsqd").is_file():
                return Path(done.stdout.strip())
    return None
