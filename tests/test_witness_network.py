"""Notaries that witness each other (issue 34), end to end on loopback:
three notaries A, B and C, each cosigning the other two's logs. A user
whose bundles promise two witnesses per log gets answers whose inclusion
checkpoint they cosigned; a victim shown a fork of A's log (the same key
and origin, another history: an impostor A on its own database) gets no
cosignature on it, and the victim's check refuses A, keeping both signed
checkpoints as evidence: the one the witnesses hold, served by B, and the
one the victim was shown."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from notary.client import check as client
from notary.client.checkpoints import CheckpointBook
from notary.client.witnesses import WitnessChoice
from notary.model.targets import Target
from notary.protocol import tlog, v2
from notary.protocol.voting import Verdict
from tests.support.cli_runs import run_cli
from tests.support.log_notaries import logged_statement
from tests.support.metrics import value
from tests.support.tls_targets import open_tls_target, static_resolver
from tests.support.witness_network import Member, open_member, plan_network

SITE, OTHER = "www.example.test", "other.example.test"


def others(network: dict[str, Member], name: str) -> list[Member]:
    return [m for key, m in network.items() if key != name]


async def ask(site, bundles, book: CheckpointBook, **options) -> dict[str, client.NotaryAnswer]:
    report = await client.check(
        Target(SITE, site.port), bundles, resolver=static_resolver({SITE: [site.host]}),
        relay=None, timeout_s=15.0, use_v2=True, checkpoints=book, quorum=len(bundles),
        **options,
    )
    return {answer.notary: answer for answer in report.answers}


async def test_a_fork_shown_to_a_victim_is_refused_and_caught_by_the_witnesses(
    tmp_path: Path,
) -> None:
    network = plan_network(tmp_path, ["a", "b", "c"])
    a, b, c = network["a"], network["b"], network["c"]
    async with open_tls_target(names=[SITE, OTHER]) as site:
        sites = {SITE: [site.host], OTHER: [site.host]}
        async with (
            open_member(a, witnesses=[b, c], witnessed=[b, c], sites=sites, min_cosignatures=2),
            open_member(b, witnesses=[a, c], witnessed=[a, c], sites=sites,
                        min_cosignatures=2) as honest_b,
            open_member(c, witnesses=[a, b], witnessed=[a, b], sites=sites,
                        min_cosignatures=2) as honest_c,
        ):
            bundles = [m.bundle(others(network, m.name), 2) for m in (a, b, c)]
            honest = await ask(site, bundles, CheckpointBook(tmp_path / "user"))
            for member in (a, b, c):
                answer = honest[f"Notary {member.name}"]
                assert answer.verdict is Verdict.SUCCESS, answer.detail
                witnesses = sorted(w.witness_name for w in others(network, member.name))
                assert f"witnessed by {', '.join(witnesses)}" in answer.detail

            # A forks its log for a victim: the same key and origin, another
            # history, behind the bundle of A the victim was given.
            impostor = a.impostor(tmp_path / "a-victim")
            async with open_member(
                impostor, witnesses=[b, c], witnessed=[], sites=sites, min_cosignatures=2,
                log={"witness_wait_s": 1.0},
            ) as fork:
                # Its history differs from the first entry on (a statement A
                # never logged), so no later checkpoint extends the witnessed one.
                await logged_statement(fork, (OTHER, site.port))
                victim_bundles = [impostor.bundle([b, c], 2), *bundles[1:]]
                book = CheckpointBook(tmp_path / "victim")
                with trio.fail_after(30):
                    while True:  # the impostor has tried both witnesses (and failed)
                        submitter = fork.running.log_witnesses
                        assert submitter is not None
                        if submitter.failures >= 2:
                            break
                        await trio.sleep(0.05)
                answers = await ask(site, victim_bundles, book)
                refused = answers["Notary a"]
                assert refused.verdict is Verdict.FAILURE, refused.detail
                assert "equivocating" in refused.detail, refused.detail
                assert "b.test/witness" in refused.detail or "c.test/witness" in refused.detail
                # B and C still vouch.
                assert answers["Notary b"].verdict is Verdict.SUCCESS
                assert answers["Notary c"].verdict is Verdict.SUCCESS
                # Both signed checkpoints are kept: two trees of A's log that
                # no consistency proof reconciles, each signed by A's key.
                (folder,) = (tmp_path / "victim").glob("*.equivocation-*")
                notes = [(folder / f).read_text() for f in ("older.checkpoint", "newer.checkpoint")]
                trees = [v2.verify_checkpoint(n, a.origin, a.public_raw) for n in notes]
                assert trees[0] != trees[1]
                # The one the witnesses hold carries their cosignatures.
                policy = tlog.WitnessPolicy((b.witness_vkey, c.witness_vkey), 1)
                judged = [policy.judge(n, now=int(time.time())) for n in notes]
                assert any(j.witnessed for j in judged)
                # A's witnesses never cosigned the fork, and count it refused.
                assert submitter.cosignatures == 0
                for member in (honest_b, honest_c):
                    assert member.running.metrics is not None
                    text = (await member.running.metrics.render()).decode()
                    assert value(text, "notary_witness_refused_total", status="422") >= 1


async def test_a_witness_that_is_down_leaves_the_decision_to_the_clients_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    network = plan_network(tmp_path, ["a", "b"])
    a, b = network["a"], network["b"]
    for sock in b.sockets["api"]:  # B never listens: its port refuses
        sock.close()
    async with open_tls_target(names=[SITE]) as site:
        sites = {SITE: [site.host]}
        async with open_member(
            a, witnesses=[b], witnessed=[], sites=sites, min_cosignatures=1,
            log={"witness_wait_s": 0.3},
        ) as notary:
            bundle = a.bundle([b], 1)
            await logged_statement(notary, (SITE, site.port))
            book = CheckpointBook(tmp_path / "user")
            strict = (await ask(site, [bundle], book))["Notary a"]
            assert strict.verdict is Verdict.FAILURE
            assert "not witnessed" in strict.detail and "promise runs until" in strict.detail
            assert "cosigned by 0 of the 1 witnesses required" in strict.detail
            lenient = (await ask(site, [bundle], book, witnesses=WitnessChoice(minimum=0)))
            assert lenient["Notary a"].verdict is Verdict.SUCCESS, lenient["Notary a"].detail
            # The notary kept appending, answered after its bounded wait,
            # and says so.
            assert notary.running.log is not None and notary.running.log.head is not None
            assert notary.running.log.head.size >= 1
            cosigned = notary.running.cosigned
            assert cosigned is not None and cosigned.unwitnessed_answers >= 1
            assert cosigned.witnessed is None
            # `notary log verify` and `watch` hold the served checkpoint to
            # the same policy: exit 8, the reason shown; --min-witnesses 0
            # reads the log.
            path = tmp_path / "a.notary"
            path.write_bytes(bundle.to_json())
            state = tmp_path / "watch.state"
            for command in (["verify"], ["watch", "--domain", "example.test", "--once",
                                         "--state", str(state)]):
                status, out, _ = await run_cli(capsys, "log", command[0], str(path), *command[1:])
                assert status == 8, out
                assert "UNWITNESSED" in out and "cosigned by 0 of the 1" in out
                status, out, _ = await run_cli(
                    capsys, "log", command[0], str(path), *command[1:], "--min-witnesses", "0"
                )
                assert status == 0, out
            assert state.exists()


async def test_checks_count_only_the_witnesses_the_user_trusts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    network = plan_network(tmp_path, ["a", "b"])
    a, b = network["a"], network["b"]
    stranger = tlog.cosigner_key("stranger.test/witness", a.public_raw[::-1])
    async with open_tls_target(names=[SITE]) as site:
        sites = {SITE: [site.host]}
        async with (
            open_member(b, witnesses=[], witnessed=[a], sites=sites),
            open_member(a, witnesses=[b], witnessed=[], sites=sites, min_cosignatures=1),
        ):
            bundle = a.bundle([b], 1)
            book = CheckpointBook(tmp_path / "user")
            trusted = (await ask(site, [bundle], book))["Notary a"]
            assert trusted.verdict is Verdict.SUCCESS
            assert "witnessed by b.test/witness" in trusted.detail
            # The user's own witness list replaces the bundle's: B's line is
            # then a stranger's, ignored, and the check fails.
            own = WitnessChoice((stranger,))
            refused = (await ask(site, [bundle], book, witnesses=own))["Notary a"]
            assert refused.verdict is Verdict.FAILURE
            assert "cosigned by 0 of the 1 witnesses required" in refused.detail
            path = tmp_path / "a.notary"
            path.write_bytes(bundle.to_json())
            status, out, _ = await run_cli(capsys, "log", "verify", str(path))
            assert status == 0 and "witnessed: cosigned by 1 of the 1" in out, out
            status, out, _ = await run_cli(
                capsys, "log", "verify", str(path), "--witness", stranger
            )
            assert status == 8 and "UNWITNESSED" in out
            # Asking more witnesses than are trusted is a usage error.
            status, _, err = await run_cli(
                capsys, "log", "verify", str(path), "--min-witnesses", "2"
            )
            assert status == 2 and "2 witnesses required" in err
            status, _, err = await run_cli(
                capsys, "check", f"{SITE}:{site.port}", "--notary", str(path), "--witness", "x"
            )
            assert status == 2 and "--v2" in err
