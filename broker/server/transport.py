"""A V2 connection's transport: the stream it reads and writes, and what IDENTIFY made of it.

A connection starts plain, on its socket. A negotiating IDENTIFY may agree TLS and then
snappy or deflate (:mod:`broker.server.upgrade` performs them, in nsqd's order); this holds
the stream as it is now, the server's TLS context (None: TLS is not offered), the upgrade
agreed and not yet performed (:class:`Upgrade`), the codec of a compressed stream, and the facts ``/stats``,
``/metrics`` and AUTH report: TLS (its version, cipher suite and the client certificate's
common name), snappy, deflate and its level.

Plain data, no I/O and no imports of TLS or compression (loaded by the first upgrade): owned
by its :class:`~broker.server.client.Client`, changed by :mod:`broker.server.identify`
and :mod:`broker.server.upgrade`, read by :mod:`broker.server.tcp`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    import ssl

    from broker.server.compression import Codec

__all__ = ["Transport", "Upgrade"]


class Upgrade:
    """What one IDENTIFY agreed, handed from the reader to the writer.

    ``plain_frames`` is how many queued output items (up to the IDENTIFY response) go out
    before the upgrade; ``leftover`` the bytes the reader had received past IDENTIFY,
    which belong to the upgraded stream. ``done`` is set once the writer has finished
    (``failed`` tells how).
    """

    __slots__ = ("tls", "codec", "plain_frames", "leftover", "failed", "done")

    def __init__(self, tls: bool, codec: Codec | None):
        self.tls = tls
        self.codec = codec
        self.plain_frames = 0
        self.leftover = b""
        self.failed = False
        self.done = trio.Event()


class Transport:
    """One V2 connection's stream, plain until an upgrade agreed in IDENTIFY is performed."""

    __slots__ = ("stream", "ssl_context", "upgrade", "codec", "tls", "tls_version", "tls_cipher_suite",
                 "tls_common_name", "snappy", "deflate", "deflate_level")

    def __init__(self, stream: trio.abc.Stream, ssl_context: ssl.SSLContext | None = None):
        self.stream = stream  # replaced by the TLS stream once TLS is on
        self.ssl_context = ssl_context
        self.upgrade: Upgrade | None = None  # agreed by IDENTIFY, not yet performed by the writer
        self.codec: Codec | None = None  # compresses and decompresses the stream once it is on
        self.tls = False
        self.tls_version = ""
        self.tls_cipher_suite = ""
        self.tls_common_name = ""
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
