"""The address of one nsqd TCP listener."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Address"]


@dataclass(frozen=True, slots=True)
class Address:
    """One nsqd TCP address; prints as ``host:port`` (``[v6]:port``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
