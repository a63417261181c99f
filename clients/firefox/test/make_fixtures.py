"""Answers the Python notary signs, for the add-on's Node tests
(clients/firefox/test/*.test.mjs): the notary's own code builds and signs
each (notary.protocol.v2, notary.protocol.convergence, notary.protocol.tlog,
notary.state.crypto), with fresh keys each run.

    .venv/bin/python clients/firefox/test/make_fixtures.py [OUT.json]

Default output: clients/firefox/test/fixtures/answers.json (committed, so
`node --test` runs alone). tests/test_firefox_addon_unit.py writes a fresh
set to a temporary file and runs the Node tests against it
(NOTARY_FIXTURES), so the add-on is checked against what the notary signs
today, not only what it signed when the file was committed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import sys
from pathlib import Path

import trustme
from cryptography.hazmat.primitives.serialization import Encoding

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from notary.model.observations import Certificate, Observation, Timeline  # noqa: E402
from notary.model.targets import Target  # noqa: E402
from notary.protocol import convergence, tlog, v2  # noqa: E402
from notary.protocol.bundle import BundleHost, BundleLog, make_bundle  # noqa: E402
from notary.state import crypto  # noqa: E402

OUT = Path(__file__).resolve().parent / "fixtures" / "answers.json"
NOW = 1_800_000_000
ORIGIN = "notary.test/v2/log"


def leaf(ca: trustme.CA, name: str) -> Certificate:
    pem = ca.issue_cert(name).cert_chain_pems[0].bytes().decode("ascii")
    return Certificate.from_der(ssl.PEM_cert_to_DER_cert(pem))


def signed(statement: dict, signer: crypto.Ed25519Signer) -> v2.SignedStatement:
    return v2.sign_statement(statement, signer.sign)


def answer(results: list[v2.QueryResult], nonce: str, signer: crypto.Ed25519Signer) -> str:
    return v2.answer_bytes(
        results, nonce=nonce, signed_at=NOW, key_id=signer.key_id, sign=signer.sign
    ).decode("utf-8")


def make() -> dict:
    ca = trustme.CA()
    site, other, rogue = leaf(ca, "site.test"), leaf(ca, "other.test"), leaf(ca, "rogue.test")
    rsa_key = crypto.generate_rsa_key()
    notary_cert = crypto.make_self_signed_certificate(rsa_key, "127.0.0.1")
    pem = crypto.certificate_pem(notary_cert).decode("ascii")
    ed_key = crypto.generate_ed25519_key()
    signer = crypto.Ed25519Signer(ed_key)
    v2_key = base64.b64encode(signer.public_raw).decode("ascii")
    bundle = make_bundle(
        name="Fixture notary", location="https://127.0.0.1/fixture.notary",
        hosts=[BundleHost("127.0.0.1", 4243, 8280, pem, v2_key=v2_key)],
        log=BundleLog.of(ORIGIN, signer.public_raw),
    )
    legacy_bundle = make_bundle(
        name="Legacy fixture notary", location="https://127.0.0.1/legacy.notary",
        hosts=[BundleHost("127.0.0.1", 4243, 8280, pem)],
    )

    site_target, other_target = Target("site.test", 443), Target("other.test", 8443)
    site_timeline = Timeline(site_target, (
        Observation(site, NOW - 86400 * 30, NOW - 60, ("192.0.2.1",)),
    ))
    other_timeline = Timeline(other_target, (Observation(other, NOW - 7200, NOW - 10, ("192.0.2.2",)),))
    site_statement = signed(
        v2.statement(site_timeline, key_id=signer.key_id, signed_at=NOW - 30, valid_for_s=86400),
        signer,
    )
    other_statement = signed(
        v2.statement(other_timeline, key_id=signer.key_id, signed_at=NOW - 30, valid_for_s=86400),
        signer,
    )
    queries = [
        {"host": "site.test", "port": 443, "sha256": site.sha256.hex()},
        {"host": "other.test", "port": 8443, "sha256": rogue.sha256.hex()},
        {"host": "new.test", "port": 443, "sha256": rogue.sha256.hex()},
    ]
    nonce = "0123456789abcdef0123456789abcdef"
    plain = answer([
        v2.QueryResult(site_target, v2.VERDICT_MATCH, site_statement),
        v2.QueryResult(other_target, v2.VERDICT_MISMATCH, other_statement),
        v2.QueryResult(Target("new.test", 443), v2.VERDICT_UNREACHABLE, None),
    ], nonce, signer)

    # A notary of issue 31 (several certificates): the statement carries
    # "consistency" and the result "matched_by", members this client does
    # not know, covered by the signatures.
    split_timeline = Timeline(site_target, (
        Observation(site, NOW - 86400, NOW - 60, ("192.0.2.1",)),
        Observation(other, NOW - 86400, NOW - 90, ("192.0.2.2",)),
    ))
    split = v2.statement(split_timeline, key_id=signer.key_id, signed_at=NOW - 30, valid_for_s=86400)
    split["consistency"] = {
        "kind": "split", "addresses": ["192.0.2.1", "192.0.2.2"],
        "current": [site.sha256.hex(), other.sha256.hex()],
    }
    split_statement = signed(split, signer)
    envelope = v2.envelope(
        [v2.QueryResult(site_target, v2.VERDICT_MATCH, split_statement)],
        nonce=nonce, signed_at=NOW, key_id=signer.key_id,
    )
    envelope["results"][0]["matched_by"] = "sha256"
    envelope_bytes = v2.canonical_json(envelope)
    several = v2.answer_document(
        [split_statement], envelope, signer.sign(envelope_bytes), envelope_bytes=envelope_bytes
    ).decode("utf-8")

    # A notary with a log: the statement promises inclusion, and its entry
    # carries the proof to a checkpoint the v2 key signed (rule S7).
    promise = v2.log_promise(ORIGIN, signed_at=NOW - 30, max_merge_delay_s=60)
    logged = signed(
        v2.statement(site_timeline, key_id=signer.key_id, signed_at=NOW - 30, valid_for_s=86400,
                     log=promise),
        signer,
    )
    leaves = [tlog.leaf_hash(b"entry zero"), tlog.leaf_hash(logged.entry), tlog.leaf_hash(b"two")]
    root = tlog.node_hash(tlog.node_hash(leaves[0], leaves[1]), leaves[2])
    proof = [leaves[0], leaves[2]]
    tlog.verify_inclusion(leaves[1], 1, 3, proof, root)
    note = tlog.sign_note(tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, 3, root)), ORIGIN,
                          signer.sign_raw, signer.public_raw)
    logged.log.item = v2.inclusion_item(logged.entry, index=1, proof=proof, checkpoint=note)
    with_log = answer([v2.QueryResult(site_target, v2.VERDICT_MATCH, logged)], nonce, signer)
    promised = signed(
        v2.statement(site_timeline, key_id=signer.key_id, signed_at=NOW - 30, valid_for_s=86400,
                     log=promise),
        signer,
    )
    with_promise = answer([v2.QueryResult(site_target, v2.VERDICT_MATCH, promised)], nonce, signer)

    # The legacy Convergence answer for site.test, signed with the RSA key of
    # the certificate the bundle pins.
    entries = convergence.entries_of(site_timeline)
    payload = convergence.signed_payload(entries)
    legacy = convergence.answer_body(payload, crypto.ConvergenceSigner(rsa_key).sign(payload))

    canonical_values = [
        {"b": 1, "a": [True, False, None, -5, 0], "c": "x"},
        {"s": "quote \" backslash \\ slash / tab \t nl \n cr \r bs \b ff \f nul \x00 us \x1f del \x7f"},
        {"unicode": "é ü 漢字 😀 \u2028 \u2029", "max": 2**53 - 1, "min": -(2**53 - 1)},
        {"nested": {"z": {"y": [1, [2, [3, {}]]]}}, "": "empty key"},
    ]
    return {
        "generated_by": "clients/firefox/test/make_fixtures.py",
        "now": NOW,
        "nonce": nonce,
        "bundle": bundle.to_json().decode("utf-8"),
        "legacy_bundle": legacy_bundle.to_json().decode("utf-8"),
        "notary_certificate_sha1": hashlib.sha1(notary_cert.public_bytes(Encoding.DER)).hexdigest(),
        "v2_key_id": signer.key_id,
        "site": {
            "der_b64": base64.b64encode(site.der).decode("ascii"),
            "sha256": site.sha256.hex(), "sha1": site.sha1.hex(), "spki_sha256": site.spki_sha256.hex(),
        },
        "other_sha256": other.sha256.hex(),
        "rogue": {"sha256": rogue.sha256.hex(), "sha1": rogue.sha1.hex()},
        "queries": queries,
        "answer": plain,
        "answer_several": several,
        "answer_logged": with_log,
        "answer_promised": with_promise,
        "log_origin": ORIGIN,
        "convergence": {"sha1": site.sha1.hex(), "answer": legacy.decode("ascii")},
        "canonical": [
            {"value": value, "text": v2.canonical_json(value).decode("utf-8")}
            for value in canonical_values
        ],
    }


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(make(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(out)


if __name__ == "__main__":
    main()
