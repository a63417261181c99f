"""A tiny DNS resolver on loopback UDP for the DANE tests: a Trio task that
answers each query with what a function of the query says, so a test can
make a resolver misbehave in ways a real one does not on demand (stray and
malformed datagrams before the answer, silence, REFUSED, answers without the
AD bit or without an SOA).

It binds 127.0.0.1 only and sends only to the address a query came from: no
packet leaves loopback. It counts the datagrams it receives and keeps the
questions asked (``FakeResolver.asked``), so a test can check that no query
was sent at all.

``open_fake_resolver(zone_answers({...}))`` yields a ``FakeResolver`` whose
``address`` goes into ``[dns] resolvers``.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import trio

#: What the resolver answers to a query: a response, or None (silence).
Answerer = Callable[[dns.message.Message], dns.message.Message | None]

#: The SOA of every zone ``zone_answers`` serves (negative TTL 300).
SOA = "ns. hostmaster. 1 3600 600 86400 300"


@dataclass
class FakeResolver:
    address: tuple[str, int]
    #: Datagrams received, parsable or not.
    datagrams: int = 0
    #: ``(name, type)`` of each query received, in order (``("www.test.", "A")``).
    asked: list[tuple[str, str]] = field(default_factory=list)


def zone_answers(
    records: Mapping[tuple[str, str], Sequence[str]], *, ad: bool = True, soa: bool = True,
    ttl: int = 300,
) -> Answerer:
    """Answers from ``records`` (``{("www.test.", "A"): ["127.0.0.1"]}``):
    the records asked for, else NODATA for a name that has other records and
    NXDOMAIN for one that has none. ``ad``: the AD bit on every answer (a
    validating resolver vouching for it); ``soa``: an SOA in the authority
    section of negative answers (without it, as a static local zone
    answers, the denial has no negative TTL)."""
    names = {name for name, _ in records}

    def answer(query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        question = query.question[0]
        name = question.name.to_text()
        texts = records.get((name, dns.rdatatype.to_text(question.rdtype)))
        if texts:
            response.answer.append(dns.rrset.from_text_list(
                question.name, ttl, dns.rdataclass.IN, question.rdtype, list(texts)))
        else:
            if name not in names:
                response.set_rcode(dns.rcode.NXDOMAIN)
            if soa:
                response.authority.append(dns.rrset.from_text(
                    dns.name.root, ttl, dns.rdataclass.IN, dns.rdatatype.SOA, SOA))
        if ad:
            response.flags |= dns.flags.AD
        return response

    return answer


def validated_root(answer: Answerer) -> Answerer:
    """``answer``, except that the root's SOA (the notary's check that its
    resolver validates, ``[dns] validation_check_name``) is answered with
    the AD bit: a validating resolver, whatever it says of other zones."""
    root = zone_answers({(".", "SOA"): [SOA]})

    def either(query: dns.message.Message) -> dns.message.Message | None:
        question = query.question[0]
        if question.name == dns.name.root and question.rdtype == dns.rdatatype.SOA:
            return root(query)
        return answer(query)

    return either


def rcode_answers(rcode: dns.rcode.Rcode) -> Answerer:
    """Answers every query with ``rcode`` and nothing else (SERVFAIL,
    REFUSED)."""

    def answer(query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.set_rcode(rcode)
        return response

    return answer


def silent(query: dns.message.Message) -> None:
    """Answers nothing."""
    return None


@asynccontextmanager
async def open_fake_resolver(
    answer: Answerer, *, strays: bool = False
) -> AsyncIterator[FakeResolver]:
    """Serve ``answer`` on 127.0.0.1 (a port of its own) until the block
    exits. ``strays``: before each answer, send the querying socket what is
    not the answer, each of which a client must ignore: a SERVFAIL with the
    query's id from another port (the wrong source), a copy of the answer
    with another id, a datagram that is not DNS, and the answer cut short
    (malformed, with the query's id)."""
    with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as served, \
            trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        await served.bind(("127.0.0.1", 0))
        await other.bind(("127.0.0.1", 0))
        fake = FakeResolver(served.getsockname())

        async def serve() -> None:
            while True:
                wire, peer = await served.recvfrom(65535)
                fake.datagrams += 1
                try:
                    query = dns.message.from_wire(wire)
                    question = query.question[0]
                except Exception:
                    continue
                fake.asked.append(
                    (question.name.to_text(), dns.rdatatype.to_text(question.rdtype)))
                response = answer(query)
                if response is None:
                    continue
                reply = response.to_wire()
                if strays:
                    failed = dns.message.make_response(query)
                    failed.set_rcode(dns.rcode.SERVFAIL)
                    await other.sendto(failed.to_wire(), peer)
                    response.id = (query.id + 1) % 65536
                    await served.sendto(response.to_wire(), peer)
                    await served.sendto(b"not a DNS message", peer)
                    await served.sendto(reply[: len(reply) - 3], peer)
                await served.sendto(reply, peer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            try:
                yield fake
            finally:
                nursery.cancel_scope.cancel()
