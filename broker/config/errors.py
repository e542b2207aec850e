"""What reading the options raises: an unusable option, or a request for help or the version."""

from __future__ import annotations

__all__ = ["OptionsError", "InstantiateError", "InfoRequest", "HelpRequest"]


class OptionsError(ValueError):
    """A flag, config file value or combination of options that cannot be used.

    The message names the flag (``--node-id must be [0,1024)``) or config key
    (``failed parsing tls_required maybe - ...``), in nsqd's wording where nsqd has one.
    """


class InstantiateError(OptionsError):
    """An option nsqd refuses when it builds the broker (``nsqd.New``), after the flags are read:
    reported as ``failed to instantiate nsqd - <message>``, as nsqd reports it."""

    PREFIX = "failed to instantiate nsqd - "


class InfoRequest(Exception):
    """``--help`` or ``--version`` was given: print :attr:`text` to stdout and exit 0."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class HelpRequest(InfoRequest):
    """``--help`` (``-h``, ``-help``) was given: :attr:`text` is the broker's usage; a
    subcommand that reads the broker's flags prints its own instead."""
