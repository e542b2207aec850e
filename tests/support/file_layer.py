"""The seam the tests' disk fakes plug into: a stand-in for the calls of ``diskqueue.fileops``.

:class:`~tests.support.diskfaults.FaultyDisk` (calls that fail) and
:class:`~tests.support.powercut.Recorder` (calls recorded for the power-cut model) are both
file layers: each says which calls it replaces, and :meth:`FileLayer.installed` puts them in
place around the code under test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

from diskqueue import fileops

__all__ = ["FileLayer"]


class FileLayer:
    """A replacement for some calls of ``diskqueue.fileops``; a subclass names them in :meth:`calls`."""

    def calls(self) -> dict[str, Callable[..., Any]]:
        """The replacements, by the name of the ``fileops`` function each one stands in for."""
        raise NotImplementedError

    @contextmanager
    def installed(self) -> Iterator[Self]:
        """Route ``diskqueue.fileops`` through this layer while the block runs (a call already
        running in a worker thread keeps the function it started with)."""
        previous = fileops.substitute(self.calls())
        try:
            yield self
        finally:
            fileops.substitute(previous)
