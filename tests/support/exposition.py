"""Prometheus's text exposition (``GET /metrics``), read back for the tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["metric_samples"]


def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of ``text``: ``{(sample name, sorted (label, value) pairs): value}``."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found
