"""A chunked request body, decoded as Go 1.19's ``net/http`` decodes it.

Go's ``internal.chunkedReader`` and the request body's ``readTrailer`` decide where a
chunked body ends, so they decide where the next request on the connection begins; a
decoder that ends a body anywhere else would let one request hide in another. Their rules:

* a chunk-size line ends at LF and, LF included, is shorter than 4096 bytes; spaces, tabs,
  CRs and LFs at its end are dropped, then everything from the first ``;`` (extensions,
  not checked); what is left is 0 to 16 hex digits (no sign, no space before them, no
  ``0x``); no digits at all means size 0;
* chunk data is followed by exactly CR LF;
* after the size-0 chunk, CR LF ends the body; anything else is a trailer, which must show
  CR LF CR LF within the next 4096 bytes and is read as header lines up to the first blank
  line (LF or CR LF): a line that neither continues the one before (space or tab first,
  never as the first line) nor holds a ``:`` is an error.

Any fault ends the body with an error; Go then closes the connection after its answer.
"""

from __future__ import annotations

__all__ = ["ChunkedBody", "ChunkedBodyError"]

#: A chunk-size line, LF included, is shorter than this (Go's ``maxLineLength``, the size
#: of its reader's buffer).
MAX_LINE_BYTES = 4096
#: A trailer shows its end (CR LF CR LF) within this many bytes (the buffer's size).
TRAILER_WINDOW = 4096
#: Most hex digits in a chunk size (a uint64).
_MAX_SIZE_DIGITS = 16
_HEX = b"0123456789abcdefABCDEF"
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedBodyError(ValueError):
    """The body's chunking is malformed (the message is Go's)."""


class ChunkedBody:
    """The decoding state of one chunked body; :meth:`feed` it the connection's bytes."""

    __slots__ = ("_state", "_left")

    def __init__(self) -> None:
        self._state = _SIZE
        self._left = 0  # data bytes still to come in the current chunk

    @property
    def done(self) -> bool:
        """The body has ended (its trailer included)."""
        return self._state == _DONE

    def feed(self, buf: bytes | bytearray, pos: int, parts: list[bytes]) -> int:
        """Decode ``buf`` from ``pos``, appending the body's bytes to ``parts``; returns
        where decoding stopped: the end of the body, or the start of a piece (size line,
        CR LF, trailer) not yet whole, to be fed again with what follows it.

        Raises :class:`ChunkedBodyError` for malformed chunking.
        """
        end = len(buf)
        while pos < end:
            state = self._state
            if state == _DATA:
                take = min(self._left, end - pos)
                parts.append(bytes(buf[pos:pos + take]))
                pos += take
                self._left -= take
                if not self._left:
                    self._state = _DATA_END
            elif state == _SIZE:
                newline = buf.find(b"\n", pos, pos + MAX_LINE_BYTES - 1)
                if newline < 0:
                    if end - pos >= MAX_LINE_BYTES - 1:
                        raise ChunkedBodyError("header line too long")
                    return pos
                size = self._size(bytes(buf[pos:newline]))
                pos = newline + 1
                if size:
                    self._left = size
                    self._state = _DATA
                else:
                    self._state = _TRAILER
            elif state == _DATA_END:
                if end - pos < 2:
                    return pos
                if buf[pos:pos + 2] != b"\r\n":
                    raise ChunkedBodyError("malformed chunked encoding")
                pos += 2
                self._state = _SIZE
            elif state == _TRAILER:
                return self._trailer(buf, pos)
            else:
                return pos
        return pos

    @staticmethod
    def _size(line: bytes) -> int:
        """``parseHexUint`` of a size line without its LF."""
        digits = line.rstrip(b" \t\r\n").partition(b";")[0]
        if digits.translate(None, _HEX):
            raise ChunkedBodyError("invalid byte in chunk length")
        if len(digits) > _MAX_SIZE_DIGITS:
            raise ChunkedBodyError("http chunk length too large")
        return int(digits, 16) if digits else 0

    def _trailer(self, buf: bytes | bytearray, pos: int) -> int:
        """Read what follows the last chunk: CR LF, or header lines up to a blank line."""
        end = len(buf)
        if end - pos < 2:
            return pos
        if buf[pos:pos + 2] == b"\r\n":
            self._state = _DONE
            return pos + 2
        if buf.find(b"\r\n\r\n", pos, pos + TRAILER_WINDOW) < 0:
            if end - pos >= TRAILER_WINDOW:
                raise ChunkedBodyError("http: suspiciously long trailer after chunked body")
            return pos
        first = True
        while True:  # a blank line comes by the CR LF CR LF at the latest
            newline = buf.find(b"\n", pos)
            line = bytes(buf[pos:newline]).removesuffix(b"\r")
            pos = newline + 1
            if not line:
                self._state = _DONE
                return pos
            if line[:1] in (b" ", b"\t"):
                if first:
                    raise ChunkedBodyError("malformed MIME header initial line")
            elif b":" not in line:
                raise ChunkedBodyError("malformed MIME header line")
            first = False
