"""How long the property tests run: seeded and short in CI, random and as long as asked otherwise.

``PYNSQD_FUZZ_EXAMPLES`` is the number of generated inputs per test; with it set the run is
random, otherwise derandomized (the same inputs every run)::

    PYNSQD_FUZZ_EXAMPLES=20000 python -m pytest -q -p no:cacheprovider tests/unit/test_fuzz_*.py \
        --hypothesis-show-statistics
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["FUZZ", "fuzz"]

_LONG_RUN = os.environ.get("PYNSQD_FUZZ_EXAMPLES")


def fuzz(ci_examples: int) -> settings:
    """Hypothesis settings: ``ci_examples`` derandomized inputs, or a random long run."""
    return settings(
        max_examples=int(_LONG_RUN or ci_examples),
        derandomize=not _LONG_RUN,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


#: The settings of most property tests.
FUZZ = fuzz(300)
