"""A throwaway DNSSEC stack on loopback for the DANE tests: a private root
zone signed here (dnspython, an ECDSA P-256 key made for the test), served
by ``nsd``, and a validating ``unbound`` that trusts only that key and asks
only that server. No packet leaves loopback: unbound's only upstream is a
stub for "." at 127.0.0.1, it binds its outgoing sockets to 127.0.0.1,
forwards nowhere and has no root hints; ``check_loopback_only`` reads its
configuration back and refuses anything else, and each fixture calls it
before starting unbound. Both servers run in the foreground as children of
the test and are stopped by PID.

``dnssec_stack(records)`` starts both with the zone's records (``(name,
type, text)``: ``("_443._tcp.www.test.", "TLSA", "3 1 1 ab..")``) and
yields the resolver's address. ``DnssecStack.replace`` signs the zone
again with other records, with the same key, and has nsd read it while
the test runs (with ``cache_max_ttl=0``, unbound caches nothing, so the
next lookup sees them). Skips when unbound or nsd is not installed
(``.ci/install-tools tests`` installs them).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ZONE_TTL = 300


Records = Sequence[tuple[str, str, str]]


@dataclass(frozen=True)
class DnssecStack:
    resolver: tuple[str, int]  # (address, port) of the validating resolver
    authority: tuple[str, int]  # the signed zone's server
    directory: Path
    _replace: Callable[[Records], None] | None = field(default=None, repr=False)

    def replace(self, records: Records) -> None:
        """Serve the signed zone with ``records`` in place of those it
        had (signed with the same key, a higher SOA serial), once nsd
        answers with it: a lookup that reaches nsd from now on sees them."""
        assert self._replace is not None
        self._replace(records)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
    with socket.socket() as tcp:  # the same port must be free for TCP too
        try:
            tcp.bind(("127.0.0.1", port))
        except OSError:
            return _free_port()
    return port


def signed_root_zone(records: Records, *, expired: bool = False,
                     delegated: Sequence[str] = (), key: object = None,
                     serial: int = 1) -> tuple[str, str]:
    """The zone file of a private root holding ``records``, signed with
    ``key`` (an ECDSA P-256 private key; a new one when None) (NSEC chain,
    so absent names are proven absent), and the trust anchor (its DNSKEY)
    in zone-file form. ``expired``: signatures that expired yesterday (a
    bogus zone). ``serial``: the SOA's."""
    import dns.dnssec
    import dns.name
    import dns.rdata
    import dns.rdataclass
    import dns.rdatatype
    import dns.zone
    from cryptography.hazmat.primitives.asymmetric import ec

    if key is None:
        key = ec.generate_private_key(ec.SECP256R1())
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    dnskey = dns.dnssec.make_dnskey(key.public_key(), dns.dnssec.Algorithm.ECDSAP256SHA256,
                                    flags=257)
    zone = dns.zone.Zone(dns.name.root, relativize=False)
    base = [
        (".", "SOA", f"ns. hostmaster. {serial} 3600 600 86400 300"),
        (".", "NS", "ns."),
        ("ns.", "A", "127.0.0.1"),
        *((child, "NS", "ns.") for child in delegated),  # no DS: insecure children
    ]
    with zone.writer() as txn:
        for name, kind, text in (*base, *records):
            rdata = dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.from_text(kind), text)
            txn.add(dns.name.from_text(name), ZONE_TTL, rdata)
    now = time.time()
    inception, expiration = (now - 2 * 86400, now - 86400) if expired else (now - 3600, now + 86400)
    dns.dnssec.sign_zone(zone, keys=[(key, dnskey)], inception=inception,
                         expiration=expiration, dnskey_ttl=ZONE_TTL)
    anchor = f". {ZONE_TTL} IN DNSKEY {dnskey.to_text()}\n"
    return zone.to_text(relativize=False), anchor


def check_loopback_only(config: str, authority_port: int) -> None:
    """Refuse an unbound configuration that could send a packet off
    loopback: forwarding, root hints, a stub or outgoing address other than
    127.0.0.1."""
    problems = []
    if re.search(r"^\s*(forward-zone|forward-addr|root-hints)\s*:", config, re.M):
        problems.append("forwarding or root hints")
    for address in re.findall(r"^\s*stub-addr\s*:\s*(\S+)", config, re.M):
        if address != f"127.0.0.1@{authority_port}":
            problems.append(f"stub-addr {address}")
    outgoing = re.findall(r"^\s*outgoing-interface\s*:\s*(\S+)", config, re.M)
    if outgoing != ["127.0.0.1"]:
        problems.append(f"outgoing-interface {outgoing}")
    if problems:
        raise AssertionError(f"unbound would leave loopback: {', '.join(problems)}")


def _wait_for_port(process: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited: {log.read_text()[-2000:]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{process.args[0]} did not listen on {port}: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


#: The unsigned child zone ``dnssec_stack`` serves beside the root.
INSECURE_ZONE = "insecure.test."


def _serial(authority: tuple[str, int]) -> int | None:
    """The root zone's SOA serial as nsd at ``authority`` (loopback)
    answers it now (None: no answer yet)."""
    import dns.exception
    import dns.message
    import dns.query
    import dns.rdatatype

    try:
        answer = dns.query.udp(dns.message.make_query(".", dns.rdatatype.SOA), authority[0],
                               port=authority[1], timeout=1.0)
    except (dns.exception.DNSException, OSError):
        return None
    for rrset in answer.answer:
        if rrset.rdtype == dns.rdatatype.SOA:
            return int(rrset[0].serial)
    return None


@contextmanager
def dnssec_stack(records: Records, *, expired: bool = False,
                 unsigned: Records = (), cache_max_ttl: int | None = None,
                 ) -> Iterator[DnssecStack]:
    """The stack; ``unsigned``: records of ``INSECURE_ZONE``, delegated
    from the root without a DS (so proven insecure); ``cache_max_ttl``:
    unbound's (0: it caches nothing, for a test that replaces records)."""
    nsd, unbound = shutil.which("nsd", path="/usr/sbin:/usr/bin"), shutil.which(
        "unbound", path="/usr/sbin:/usr/bin")
    if nsd is None or unbound is None:
        pytest.skip("unbound and nsd are not installed (.ci/install-tools tests installs them)")
    try:
        import dns.dnssec  # noqa: F401
    except ImportError:
        pytest.skip("dnspython is not installed (pip install -e '.[test]')")
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = Path(tempfile.mkdtemp(prefix="notary-dnssec-"))
    key = ec.generate_private_key(ec.SECP256R1())
    zone_text, anchor = signed_root_zone(records, expired=expired, delegated=[INSECURE_ZONE],
                                         key=key)
    (directory / "root.zone").write_text(zone_text)
    (directory / "insecure.zone").write_text("".join(
        f"{name} {ZONE_TTL} IN {kind} {text}\n" for name, kind, text in (
            (INSECURE_ZONE, "SOA", "ns. hostmaster. 1 3600 600 86400 300"),
            (INSECURE_ZONE, "NS", "ns."), *unsigned,
        )
    ))
    (directory / "root.key").write_text(anchor)
    authority_port, resolver_port = _free_port(), _free_port()
    (directory / "nsd.conf").write_text(
        "server:\n"
        f"  ip-address: 127.0.0.1@{authority_port}\n  do-ip6: no\n"
        f'  username: ""\n  chroot: ""\n  zonesdir: "{directory}"\n'
        f'  pidfile: "{directory}/nsd.pid"\n  database: ""\n'
        f'  xfrdfile: "{directory}/xfrd.state"\n  zonelistfile: "{directory}/zone.list"\n'
        f'  logfile: "{directory}/nsd.log"\n'
        "remote-control:\n  control-enable: no\n"
        'zone:\n  name: "."\n  zonefile: "root.zone"\n'
        f'zone:\n  name: "{INSECURE_ZONE}"\n  zonefile: "insecure.zone"\n'
    )
    cache = "" if cache_max_ttl is None else (
        f"  cache-max-ttl: {cache_max_ttl}\n  cache-max-negative-ttl: {cache_max_ttl}\n"
    )
    unbound_config = (
        "server:\n"
        f"  interface: 127.0.0.1@{resolver_port}\n  port: {resolver_port}\n"
        "  outgoing-interface: 127.0.0.1\n  do-ip6: no\n  do-not-query-localhost: no\n"
        f'  username: ""\n  chroot: ""\n  directory: "{directory}"\n'
        f'  pidfile: "{directory}/unbound.pid"\n  use-syslog: no\n'
        f'  logfile: "{directory}/unbound.log"\n  verbosity: 1\n'
        f'  trust-anchor-file: "{directory}/root.key"\n'
        "  harden-dnssec-stripped: yes\n  val-log-level: 2\n  qname-minimisation: no\n"
        "  access-control: 127.0.0.0/8 allow\n"
        f"{cache}"
        # test. is one of unbound's built-in blocked local zones (RFC 6761).
        '  local-zone: "test." nodefault\n'
        "remote-control:\n  control-enable: no\n"
        f'stub-zone:\n  name: "."\n  stub-addr: 127.0.0.1@{authority_port}\n'
    )
    check_loopback_only(unbound_config, authority_port)
    (directory / "unbound.conf").write_text(unbound_config)
    started: list[subprocess.Popen] = []
    serials = [1]

    def replace(replaced: Records) -> None:
        serial = serials[-1] + 1
        text, _ = signed_root_zone(replaced, expired=expired, delegated=[INSECURE_ZONE], key=key,
                                   serial=serial)
        zone = directory / "root.zone"
        before = zone.stat().st_mtime
        zone.write_text(text)
        os.utime(zone, (before + serial, before + serial))  # nsd reads a zone whose mtime changed
        os.kill(started[0].pid, signal.SIGHUP)
        deadline = time.monotonic() + 15
        while _serial(authority) != serial:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nsd did not load serial {serial}")
            time.sleep(0.05)
        serials.append(serial)

    authority = ("127.0.0.1", authority_port)
    try:
        for argv, port, log in (
            ([nsd, "-d", "-c", str(directory / "nsd.conf")], authority_port, "nsd.log"),
            ([unbound, "-d", "-c", str(directory / "unbound.conf")], resolver_port,
             "unbound.log"),
        ):
            with open(directory / f"{log}.out", "wb") as out:
                process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL)
            started.append(process)
            _wait_for_port(process, port, directory / f"{log}.out")
        yield DnssecStack(("127.0.0.1", resolver_port), authority, directory, replace)
    finally:
        for process in reversed(started):
            _stop(process)
        shutil.rmtree(directory, ignore_errors=True)
