"""How a node's link to a peer packs its requests into ``REPL`` bodies
(broker/replication/links.py): every body it sends is one the peer accepts
(``decode_requests``), and each request is sent once."""

from __future__ import annotations

from broker.protocol.replica import encode_repl
from broker.replication.links import PeerLink
from broker.replication.wire import Channels, Fin, Gone, WireLimits, decode_requests

LIMITS = WireLimits(max_msg_size=100)
ME, PEER, OTHER = "a" * 32, "b" * 32, "c" * 32
ID = b"0123456789abcdef"


def _link() -> PeerLink:
    link = PeerLink(("127.0.0.2", 4150), ME, 2.0, lambda link, answer: None, lambda link: None)
    link.connected = True  # as once its HELLO is answered; nothing is sent here, only packed
    return link


def _bodies(link: PeerLink) -> list[list]:
    """Every body the link would send now, each decoded as the peer decodes it."""
    bodies = []
    while link._requests or link._posted:
        frame = link._next_repl()
        body = frame[len(b"REPL\n") + 4:]
        assert frame == encode_repl(body)
        _seq, requests = decode_requests(body, LIMITS)  # raises WireError for a body the peer refuses
        bodies.append(requests)
    return bodies


def test_a_gone_question_goes_in_a_body_of_its_own_between_fins_and_posted_requests():
    link = _link()
    link.post(Channels("orders", ["work"]))
    fin = link.request(Fin("orders", "work", [ID]))
    gone = link.request(Gone(OTHER))
    link.post(Fin("orders", "work", [ID[::-1]]))
    link.request(Fin("orders", "other", [ID]))
    second = link.request(Gone(PEER))
    bodies = _bodies(link)
    assert [[type(r).__name__ for r in body] for body in bodies] == [
        ["Channels", "Fin"], ["Gone"], ["Fin", "Fin"], ["Gone"]]
    assert bodies[1] == [Gone(OTHER)] and bodies[3] == [Gone(PEER)]
    assert not fin.done.is_set() and not gone.done.is_set() and not second.done.is_set()  # answered by the peer


def test_requests_queued_together_share_one_body():
    link = _link()
    link.post(Channels("orders", ["work"]))
    for channel in ("a", "b", "c"):
        link.request(Fin("orders", channel, [ID]))
    assert [len(body) for body in _bodies(link)] == [4]
