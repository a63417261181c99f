"""One set of cosignatures per notary, not per worker (issue 34, item 3):
two workers of one notary (one SQLite file) or two nodes of a fleet (one
PostgreSQL database) keep one log; its checkpoints go to the witness from
one of them only (the holder of the witness's turn), once each, and the
cosignatures reach both from the store: each answers with its statements'
inclusion proven against a cosigned checkpoint, and serves it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from notary.protocol import tlog, v2
from tests.support.engines import Engine
from tests.support.log_notaries import get, query
from tests.support.metrics import value
from tests.support.tls_targets import open_tls_target
from tests.support.witness_network import open_member, plan_network

NAMES = [f"site{i}.example.test" for i in range(6)]


async def witnessed_statement(notary, target: tuple[str, int], policy) -> v2.ParsedStatement:
    """The statement of ``target``, once its inclusion leads to a checkpoint
    ``policy`` finds witnessed."""
    with trio.fail_after(20):
        while True:
            (statement,) = v2.parse_answer_document(await query(notary, target)).statements
            inclusion = statement.inclusion
            if inclusion is not None and policy.judge(
                inclusion.checkpoint, now=int(time.time())
            ).witnessed:
                return statement
            await trio.sleep(0.05)


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"], indirect=True)
async def test_each_checkpoint_goes_to_the_witness_once_per_notary(
    tmp_path: Path, engine: Engine
) -> None:
    network = plan_network(tmp_path, ["a", "b"])
    first, b = network["a"], network["b"]
    second = first.impostor(tmp_path / "a2")  # the same notary: another worker or node
    shared = (
        {"store": {"backend": "postgresql", "dsn": engine.location, "batch_interval_ms": 10}}
        if engine.postgresql else {"db_file": Path(engine.location), "shared_store": True}
    )
    policy = tlog.WitnessPolicy((b.witness_vkey,), 1)
    async with open_tls_target(names=NAMES) as site:
        sites = {name: [site.host] for name in NAMES}
        async with (
            open_member(b, witnesses=[], witnessed=[first], sites=sites) as witness,
            open_member(first, witnesses=[b], witnessed=[], sites=sites, min_cosignatures=1,
                        **shared) as one,
            open_member(second, witnesses=[b], witnessed=[], sites=sites, min_cosignatures=1,
                        **shared) as other,
        ):
            statements = []
            for index, name in enumerate(NAMES):  # each worker signs and logs its own
                worker = (one, other)[index % 2]
                statements.append(await witnessed_statement(worker, (name, site.port), policy))
            submitters = [w.running.log_witnesses for w in (one, other)]
            assert all(s is not None for s in submitters)
            submissions = [s.submissions for s in submitters]  # type: ignore[union-attr]
            # One submits; the other never does (it reads the cosignatures).
            assert sorted(submissions)[0] == 0 and sorted(submissions)[1] > 0, submissions
            holder = submitters[submissions.index(max(submissions))]
            assert holder is not None
            served = witness.running.witness
            assert served is not None
            # Each checkpoint the witness cosigned was cosigned once.
            assert served.cosigned == holder.cosignatures
            assert holder.submissions <= holder.cosignatures + 1  # the first learns by a 409
            # Both serve a cosigned checkpoint of the one log.
            for worker in (one, other):
                status, body = await get(worker, "/v2/log/checkpoint")
                assert status == 200
                assert policy.judge(body.decode(), now=int(time.time())).witnessed
                checkpoint = v2.verify_checkpoint(body.decode(), first.origin, first.public_raw)
                assert checkpoint.size >= 1
            indices = sorted(s.inclusion.index for s in statements if s.inclusion is not None)
            assert indices == sorted(set(indices))  # one log: no index used twice
            # The figures on the admin listener, each worker's own.
            for worker, submitter in zip((one, other), submitters, strict=True):
                assert worker.running.metrics is not None and submitter is not None
                text = (await worker.running.metrics.render()).decode()
                assert value(text, "notary_log_witness_submissions_total") == submitter.submissions
                assert value(text, "notary_log_cosignatures_total") == submitter.cosignatures
                assert value(text, "notary_log_witnessed_size") >= 1
                assert value(text, "notary_log_statements_witnessed_total") == 3
            assert witness.running.metrics is not None
            text = (await witness.running.metrics.render()).decode()
            assert value(text, "notary_witness_cosigned_total") == served.cosigned
            assert value(text, "notary_witness_logs") == 1
