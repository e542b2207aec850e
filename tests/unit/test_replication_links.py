"""A link's frames (broker/replication/links.py): the requests queued meanwhile share a ``REPL``
body, except one answered with data of its own (GONE, HOLDS), which its peer only takes alone
in its body: it goes in a frame of its own, and what is queued around it in the frames before
and after (a body with both is refused whole, the posted FINs in it lost)."""

from __future__ import annotations

import struct

import trio
import trio.testing

from broker.replication.links import PeerLink
from broker.replication.wire import Drop, Fin, Gone, Holds, WireLimits, decode_requests, encode_request

ME, PEER = "a" * 32, "b" * 32
ID = b"0123456789abcdef"


async def _bodies(stream: trio.abc.ReceiveStream, count: int) -> list[list]:
    """The requests of the next ``count`` REPL frames written to ``stream``."""
    data = b""
    bodies = []
    while len(bodies) < count:
        data += await stream.receive_some()
        while data.startswith(b"REPL\n") and len(data) >= 9:
            size = struct.unpack(">I", data[5:9])[0]
            if len(data) < 9 + size:
                break
            _seq, requests = decode_requests(data[9:9 + size], WireLimits(1 << 20))
            bodies.append([encode_request(request) for request in requests])
            data = data[9 + size:]
    return bodies


async def test_a_request_answered_with_data_of_its_own_goes_in_a_frame_of_its_own(autojump_clock):
    link = PeerLink(("127.0.0.1", 1), ME, 5.0, lambda link, answer: None, lambda link: None)
    link.connected = True
    send, receive = trio.testing.memory_stream_one_way_pair()
    fin, holds, gone, drop = Fin("t", "c", [ID]), Holds("t", [ID]), Gone(PEER), Drop("t", [ID])
    link.post(fin)
    link.request(holds)
    link.request(gone)
    link.post(drop)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link._write_loop, send)
        first_two = await _bodies(receive, 2)
        link._sent.clear()  # as if the peer had answered them: room for the next frames
        link._wake.set()
        last_two = await _bodies(receive, 2)
        nursery.cancel_scope.cancel()
    assert first_two + last_two == [[encode_request(fin)], [encode_request(holds)], [encode_request(gone)],
                                    [encode_request(drop)]]
