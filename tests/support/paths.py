"""Where the repository and the parts the tests read are."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEPLOY", "REPO", "SPARK"]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SPARK = REPO / "spark"
