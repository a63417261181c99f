"""The transparency log (issue 22): appends per second, proof latency up to 10M entries, and
what the log costs a v2 cache hit, each against a baseline of the same run (set-up, rows and
columns: ``bench/README.md``).

    .venv/bin/python bench/bench_log.py --wait-quiet 60   # about 5 minutes
    .venv/bin/python bench/bench_log.py --quick           # smoke run, about 30 s
    .venv/bin/python bench/bench_log.py --part proofs     # one part (appends, proofs, hit)
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cryptography.hazmat.primitives.asymmetric import ed25519
from harness.loopback import LOOPBACK, connect, free_ports
from harness.machine import cpu_seconds, describe_busy
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import print_table
from harness.runs import Run, run_rounds, start_load
from harness.runs import best as best_run
from harness.servers import NotarySetup, RunningNotary, new_notary, start_notary
from harness.tools import ensure_wrk

# Importing harness also puts the project root on sys.path.
from harness.v2requests import JSON_TYPE, add_api_ports, https, query_body
from harness.wrk import run_wrk, wrk_script

from notary.config import load_config
from notary.model.observations import Certificate, Observation, Timeline
from notary.model.targets import Target
from notary.protocol import tlog, v2
from notary.state import crypto, tlogstore
from notary.state.crypto import Ed25519Signer
from notary.state.tlogstore import LogStore

PARTS = ("appends", "proofs", "hit")
BATCHES = (1, 16, 256, 4096)
SYNCHRONOUS = ("FULL", "NORMAL")
SIZES = (1_000, 100_000, 1_000_000, 10_000_000)
HIT_BATCHES = (1, 10)
HIT_TARGETS = max(HIT_BATCHES)  # distinct targets: the notary's own HTTPS API ports
ORIGIN = "bench.localhost/v2/log"
NONCE = "bench-log"
GOAL = 0.10  # the issue: the log costs a v2 cache hit < 10%
#: Leaves checked against CompactRange (an independent path to the root).
CROSS_CHECK_LEAVES = 100_000


# -- part 1: appends ---------------------------------------------------------------------------


def statement_entries(count: int, signer: Ed25519Signer) -> list[bytes]:
    """``count`` distinct real statement entries (``SignedStatement.entry``, what the notary
    logs): one observation of a random 1,200-byte "certificate" seen from two addresses, with
    the log promise, signed."""
    made = []
    for number in range(count):
        der = os.urandom(1200)
        certificate = Certificate(der=der, sha1=hashlib.sha1(der).digest(),
                                  sha256=hashlib.sha256(der).digest(), md5=b"",
                                  spki_sha256=hashlib.sha256(der[:300]).digest())
        signed_at = 1_765_000_000 + number
        timeline = Timeline(Target(f"www{number}.example.org", 443), (Observation(
            certificate, signed_at - 900_000, signed_at, ("203.0.113.7", "2001:db8::17")),))
        statement = v2.statement(
            timeline, key_id=signer.key_id, signed_at=signed_at, valid_for_s=86_400,
            log=v2.log_promise(ORIGIN, signed_at=signed_at, max_merge_delay_s=60))
        made.append(v2.sign_statement(statement, signer.sign).entry)
    return made


def checkpoint_signer(signer: Ed25519Signer) -> Callable[[int, bytes], str]:
    """What ``LogAppender.sign_checkpoint`` does: a C2SP checkpoint in a signed note."""
    def sign(size: int, root: bytes) -> str:
        text = tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, size, root))
        return tlog.sign_note(text, ORIGIN, signer.sign_raw, signer.public_raw)
    return sign


@dataclass(frozen=True)
class AppendRun:
    entries: int
    batches: int
    seconds: float  # wall time inside the appends (fsync waits included)
    cpu_s: float  # this process's CPU time inside them

    @property
    def rate(self) -> float:
        return self.entries / self.seconds

    @property
    def ms_per_batch(self) -> float:
        return self.seconds / self.batches * 1e3

    @property
    def cpu_ms_per_batch(self) -> float:
        return self.cpu_s / self.batches * 1e3


def timed_batches(write: Callable[[int, list[bytes]], None], entries: Sequence[bytes],
                  batch: int, seconds: float) -> AppendRun:
    """``write(first_index, batch of entries)`` again and again (entries taken in turn from
    ``entries``) until ``seconds`` are spent in it, and at least 3 batches."""
    spent = cpu = 0.0
    done = batches = 0
    while spent < seconds or batches < 3:
        start = (done * 7919) % len(entries)  # cycle through the distinct entries
        chunk = [entries[(start + i) % len(entries)] for i in range(batch)]
        wall0, cpu0 = time.perf_counter(), time.process_time()
        write(done, chunk)
        spent += time.perf_counter() - wall0
        cpu += time.process_time() - cpu0
        done += batch
        batches += 1
    return AppendRun(done, batches, spent, cpu)


def append_log(path: Path, synchronous: str, entries: Sequence[bytes], batch: int,
               seconds: float, sign: Callable[[int, bytes], str]) -> AppendRun:
    """``LogStore.append`` (entries, tiles, signed checkpoint, proofs) into a fresh file."""
    with LogStore(path, synchronous=synchronous) as store:
        def write(first: int, chunk: list[bytes]) -> None:
            appended = store.append(chunk, sign)
            if appended.first_index != first or len(appended.proofs) != len(chunk):
                raise BenchError(f"append: first index {appended.first_index}, expected {first}")
        return timed_batches(write, entries, batch, seconds)


def append_plain(path: Path, synchronous: str, entries: Sequence[bytes], batch: int,
                 seconds: float) -> AppendRun:
    """The baseline: the same rows by one ``executemany`` ``INSERT`` per batch, one
    transaction each, same journal (WAL) and ``synchronous`` as the log's connection."""
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {synchronous}")
        db.execute("CREATE TABLE log_entries (idx INTEGER PRIMARY KEY, entry BLOB NOT NULL)")

        def write(first: int, chunk: list[bytes]) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT INTO log_entries (idx, entry) VALUES (?, ?)",
                           ((first + offset, entry) for offset, entry in enumerate(chunk)))
            db.execute("COMMIT")
        return timed_batches(write, entries, batch, seconds)
    finally:
        db.close()


def part_appends(args: argparse.Namespace, directory: Path, signer: Ed25519Signer) -> None:
    entries = statement_entries(4096, signer)
    sizes = [len(entry) for entry in entries]
    print(f"## 1. Appends: LogStore.append vs one executemany INSERT per batch\n\n"
          f"{len(entries):,} distinct statement entries of {min(sizes)}-{max(sizes)} bytes "
          f"(mean {statistics.mean(sizes):.0f}), each batch into a fresh file in {directory} "
          f"({filesystem_of(directory)}), WAL, for {args.append_seconds:g} s of appends (at "
          f"least 3 batches) per run; {args.rounds} round(s), interleaved, best kept; this "
          "process pinned to the server core.", flush=True)
    sign = checkpoint_signer(signer)
    runs: dict[tuple[str, int, str], list[AppendRun]] = {}
    for round_number in range(args.rounds):
        for synchronous in SYNCHRONOUS:
            for batch in BATCHES:
                for side in ("insert", "log"):
                    path = directory / f"append-{synchronous}-{batch}-{side}.db"
                    if side == "log":
                        run = append_log(path, synchronous, entries, batch,
                                         args.append_seconds, sign)
                    else:
                        run = append_plain(path, synchronous, entries, batch,
                                           args.append_seconds)
                    for leftover in directory.glob(f"{path.name}*"):
                        leftover.unlink()
                    runs.setdefault((synchronous, batch, side), []).append(run)
                    print(f"  round {round_number + 1} synchronous={synchronous} batch {batch} "
                          f"{side}: {run.rate:,.0f} entries/s, {run.ms_per_batch:.2f} ms/batch "
                          f"({run.cpu_ms_per_batch:.2f} ms CPU), {run.batches} batches",
                          flush=True)
    print()
    rows = []
    for synchronous in SYNCHRONOUS:
        for batch in BATCHES:
            log = max(runs[(synchronous, batch, "log")], key=lambda r: r.rate)
            plain = max(runs[(synchronous, batch, "insert")], key=lambda r: r.rate)
            rows.append([synchronous, f"{batch:,}", f"{log.rate:,.0f}",
                         f"{log.ms_per_batch:,.2f}", f"{log.cpu_ms_per_batch:,.2f}",
                         f"{plain.rate:,.0f}", f"{plain.ms_per_batch:,.2f}",
                         f"{plain.cpu_ms_per_batch:,.2f}", f"{log.rate / plain.rate:.1%}",
                         f"{(log.cpu_s / log.entries - plain.cpu_s / plain.entries) * 1e6:,.1f}"])
    print_table(
        ["synchronous", "batch", "log entries/s", "log ms/batch", "log CPU ms/batch",
         "INSERT entries/s", "INSERT ms/batch", "INSERT CPU ms/batch", "log / INSERT",
         "Merkle bookkeeping, CPU us/entry"], rows)


def filesystem_of(path: Path) -> str:
    """The file system ``path`` is on (/proc/mounts): fsync's cost depends on it."""
    best, found = "", "unknown file system"
    resolved = str(path.resolve())
    with open("/proc/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            device, mount, kind = line.split()[:3]
            if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) \
                    and len(mount) >= len(best):
                best, found = mount, f"{kind} on {device}"
    return found


# -- part 2: proofs ----------------------------------------------------------------------------


def _subtree_root(hashes: list[bytes]) -> bytes:
    """The root of the perfect tree over ``hashes`` (a power of two of them)."""
    sha256 = hashlib.sha256
    while len(hashes) > 1:
        hashes = [sha256(b"\x01" + hashes[i] + hashes[i + 1]).digest()
                  for i in range(0, len(hashes), 2)]
    return hashes[0]


def synthetic_leaf(index: int) -> bytes:
    return hashlib.sha256(index.to_bytes(8, "big")).digest()


def synthetic_tiles(size: int) -> dict[tuple[int, int], bytes]:
    """The tiles (level, index) -> hashes of the tree whose leaf ``i`` (its leaf hash) is
    SHA-256 of ``i`` as 8 bytes; partial tiles as wide as ``size`` makes them. The tiles of a
    smaller tree of the same leaves are these, partial ones cut (the log is append-only)."""
    tiles: dict[tuple[int, int], bytes] = {}
    above: list[bytes] = []  # the hashes of the next tile level, full subtrees only
    for index in range(-(-size // tlog.TILE_WIDTH)):
        first = index * tlog.TILE_WIDTH
        leaves = [synthetic_leaf(i) for i in range(first, min(size, first + tlog.TILE_WIDTH))]
        tiles[(0, index)] = b"".join(leaves)
        if len(leaves) == tlog.TILE_WIDTH:
            above.append(_subtree_root(leaves))
    level = 1
    while above:
        hashes, above = above, []
        for index in range(-(-len(hashes) // tlog.TILE_WIDTH)):
            part = hashes[index * tlog.TILE_WIDTH:(index + 1) * tlog.TILE_WIDTH]
            tiles[(level, index)] = b"".join(part)
            if len(part) == tlog.TILE_WIDTH:
                above.append(_subtree_root(part))
        level += 1
    return tiles


def write_tile_file(path: Path, tiles: dict[tuple[int, int], bytes], size: int,
                    checkpoint: str) -> None:
    """A LogStore-shaped SQLite file holding ``tiles`` and a head of ``size`` (no entries:
    proofs read tiles only). Built without fsync; LogStore reopens it in WAL."""
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        db.execute("PRAGMA synchronous = OFF")
        db.execute("PRAGMA journal_mode = MEMORY")
        db.executescript(tlogstore.SCHEMA)
        db.execute("BEGIN")
        db.executemany("INSERT INTO log_tiles (level, idx, hashes) VALUES (?, ?, ?)",
                       ((level, index, data) for (level, index), data in tiles.items()))
        db.execute("INSERT INTO log_head (id, size, checkpoint) VALUES (1, ?, ?)",
                   (size, checkpoint))
        db.execute("COMMIT")
    finally:
        db.close()


def percentile(samples: Sequence[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass(frozen=True)
class ProofTimes:
    us: list[float]
    tiles_read: list[int]
    hashes: list[int]

    def cell(self) -> str:
        return f"{statistics.median(self.us):,.0f} / {percentile(self.us, 0.99):,.0f}"


def time_proofs(prove: Callable[[int, Callable[[int, int], bytes] | None], list[bytes]],
                picks: Sequence[int], reader: Callable[[], tlog.TileHashReader] | None,
                *, warm: bool) -> ProofTimes:
    """Time ``prove(pick, perfect)`` for each pick: ``perfect`` of a new reader per proof
    (cold, its construction timed), or of one reader kept over all (warm; first warmed by
    a tenth as many proofs, untimed). ``reader`` None: ``prove`` reads by itself."""
    times, reads, lengths = [], [], []
    kept = reader() if reader is not None and warm else None
    if kept is not None:
        for pick in picks[: max(1, len(picks) // 10)]:
            prove(pick, kept.perfect)
    for pick in picks:
        started = time.perf_counter_ns()
        current = kept if warm else (reader() if reader is not None else None)
        before = current.tiles_read if current is not None else 0
        proof = prove(pick, current.perfect if current is not None else None)
        times.append((time.perf_counter_ns() - started) / 1e3)
        reads.append(current.tiles_read - before if current is not None else -1)
        lengths.append(len(proof))
    return ProofTimes(times, reads, lengths)


Tiles = dict[tuple[int, int], bytes]


def tile_reader(tiles: Tiles) -> tlog.ReadTile:
    """``read_tile`` from tiles in memory (a tile of a smaller tree: its first hashes)."""
    def read(level: int, index: int, width: int) -> bytes:
        return tiles[(level, index)][: width * tlog.HASH_SIZE]
    return read


def part_proofs(args: argparse.Namespace, directory: Path, signer: Ed25519Signer
                ) -> tuple[int, Tiles]:
    sizes = [size for size in SIZES if size <= args.max_size] or [args.max_size]
    largest = max(sizes)
    print(f"## 2. Proofs up to {largest:,} entries (synthetic tiles)\n", flush=True)
    started = time.perf_counter()
    tiles = synthetic_tiles(largest)
    built = time.perf_counter() - started
    in_memory = sum(len(data) for data in tiles.values())
    print(f"tiles of a {largest:,}-leaf tree (leaf i = SHA-256 of i): {len(tiles):,} tiles, "
          f"{in_memory / 2**20:,.0f} MiB, built in {built:.1f} s", flush=True)

    memory_tile = tile_reader(tiles)
    # The tiles against an independent path to the root: CompactRange over the same leaves.
    check = min(largest, CROSS_CHECK_LEAVES)
    edge = tlog.CompactRange()
    for index in range(check):
        edge.append(synthetic_leaf(index))
    if tlog.root_hash(check, tlog.TileHashReader(check, memory_tile).perfect) != edge.root():
        raise BenchError(f"synthetic tiles: the root of {check:,} leaves differs from "
                         "CompactRange's")
    roots = {size: tlog.root_hash(size, tlog.TileHashReader(size, memory_tile).perfect)
             for size in sizes}
    path = directory / "tiles.db"
    started = time.perf_counter()
    write_tile_file(path, tiles, largest, checkpoint_signer(signer)(largest, roots[largest]))
    print(f"CompactRange agrees on the root of {check:,} leaves; LogStore-shaped file "
          f"{path.stat().st_size / 2**20:,.0f} MiB written in {time.perf_counter() - started:.1f} "
          f"s ({filesystem_of(directory)}; in the OS page cache: it was just written)",
          flush=True)
    db = sqlite3.connect(str(path), check_same_thread=False)

    def sqlite_tile(level: int, index: int, width: int) -> bytes:  # LogStore._stored_tile's read
        row = db.execute("SELECT hashes FROM log_tiles WHERE level = ? AND idx = ?",
                         (level, index)).fetchone()
        return bytes(row[0])[: width * tlog.HASH_SIZE]

    store = LogStore(path)
    print(f"{args.proofs:,} proofs per cell, uniform random: inclusion of index in [0, size) "
          "in the tree of size, consistency from old in [1, size) to size; cold: a new "
          "TileHashReader per proof (as LogStore does per call), warm: one reader kept (its "
          f"default {tlog.DEFAULT_CACHED_TILES} tiles) over all the cell's proofs; LogStore: "
          "LogStore.inclusion_proof / consistency_proof on that file (head read, cold reader, "
          "SQLite); every proof of the first 20 verified against the root\n", flush=True)
    rng = random.Random(22)
    rows = []
    for size in sizes:
        for kind in ("inclusion", "consistency"):
            low = 0 if kind == "inclusion" else 1
            picks = [rng.randrange(low, size) for _ in range(args.proofs)]
            prove, api = provers(kind, size, store)
            verify_proofs(kind, size, picks[:20], prove, api, memory_tile, roots[size])
            cells = {}
            for source, read in (("memory", memory_tile), ("SQLite", sqlite_tile)):
                for warm in (False, True):
                    cells[(source, warm)] = time_proofs(
                        prove, picks, lambda read=read, size=size: tlog.TileHashReader(size, read),
                        warm=warm)
            cells[("LogStore", False)] = time_proofs(api, picks, None, warm=False)
            cold, warm_cell = cells[("memory", False)], cells[("memory", True)]
            rows.append([f"{size:,}", kind, *(cell.cell() for cell in cells.values()),
                         f"{statistics.mean(cold.tiles_read):.2f}",
                         f"{statistics.mean(warm_cell.tiles_read):.2f}",
                         f"{statistics.mean(cold.hashes):.1f}"])
            print(f"  {size:,} {kind}: memory cold {cold.cell()} us, SQLite cold "
                  f"{cells[('SQLite', False)].cell()} us, LogStore "
                  f"{cells[('LogStore', False)].cell()} us", flush=True)
    store.close()
    db.close()
    path.unlink()
    print()
    print_table(
        ["size", "proof", "memory cold: median / p99 us", "memory warm", "SQLite cold",
         "SQLite warm", "LogStore API", "tile reads/proof cold", "tile reads/proof warm",
         "hashes/proof"], rows)
    return largest, tiles


def provers(kind: str, size: int, store: LogStore) -> tuple[Callable, Callable]:
    """``(prove(pick, perfect), api(pick, _))``: the ``kind`` proof of ``pick`` (an index, or
    an old size) in the tree of ``size``, from ``perfect``, and through ``store``."""
    if kind == "inclusion":
        return (lambda pick, perfect: tlog.inclusion_proof(pick, size, perfect),
                lambda pick, _: store.inclusion_proof(pick, size))
    return (lambda pick, perfect: tlog.consistency_proof(pick, size, perfect),
            lambda pick, _: store.consistency_proof(pick, size))


def verify_proofs(kind: str, size: int, picks: Sequence[int], prove: Callable, api: Callable,
                  memory_tile: tlog.ReadTile, root: bytes) -> None:
    """Every proof of ``picks`` (from the tiles and from LogStore) verifies against ``root``."""
    for pick in picks:
        proof = prove(pick, tlog.TileHashReader(size, memory_tile).perfect)
        if api(pick, None) != proof:
            raise BenchError(f"LogStore's {kind} proof ({pick}, {size}) differs")
        try:
            if kind == "inclusion":
                tlog.verify_inclusion(synthetic_leaf(pick), pick, size, proof, root)
            else:
                old_root = tlog.root_hash(pick, tlog.TileHashReader(pick, memory_tile).perfect)
                tlog.verify_consistency(pick, size, old_root, root, proof)
        except tlog.ProofError as exc:
            raise BenchError(f"{kind} proof ({pick}, {size}) fails: {exc}") from None


# -- part 3: a v2 cache hit with the log on and off ----------------------------------------------


@dataclass
class HitNotary:
    name: str
    notary: RunningNotary
    ports: list[int]
    bodies: dict[int, str]
    answers: dict[int, bytes]


def check_answer(answer: bytes, body: str, keys: Sequence[v2.PublishedKey], *,
                 logged: bool) -> int:
    """``answer`` verifies (``verify_answer``); with ``logged`` every statement carries an
    inclusion proof that ``verify_logged`` accepts, without none has a log member. Returns
    the largest tree size of the checkpoints (0 without)."""
    now = int(time.time())
    queries = v2.parse_query_request(body.encode(), max_batch=10_000, max_body_bytes=1 << 24)
    parsed = v2.parse_answer_document(answer)
    results = v2.verify_answer(parsed, {key.key_id: key.public_key() for key in keys},
                               nonce=NONCE, now=now, queries=queries.targets,
                               max_answer_age_s=300)
    if {result.verdict for result in results} != {v2.VERDICT_MATCH}:
        raise BenchError(f"verdicts {[r.verdict for r in results]}, expected only match")
    size = 0
    for statement in parsed.statements:
        key = next(k for k in keys if k.key_id == parsed.key_id)
        checked = v2.verify_logged(statement, key.public_key_raw, now=now)
        if not logged:
            if checked is not None:
                raise BenchError("a statement of the notary without a log has a log member")
            continue
        if checked is None or checked.checkpoint is None:
            raise BenchError("a statement of the logging notary carries no inclusion proof")
        size = max(size, checked.checkpoint.size)
    return size


def prefill_log(setup: NotarySetup, size: int, tiles: Tiles) -> None:
    """Make the log in ``setup``'s database (before it starts) a tree of ``size`` leaves:
    its tiles, and a head whose checkpoint its v2 key signs. The notary then appends after
    them, so its statements' proofs are as long as in a log of that size."""
    signer = Ed25519Signer(crypto.load_ed25519_private_key(setup.directory / "v2.key"))
    root = tlog.root_hash(size, tlog.TileHashReader(size, tile_reader(tiles)).perfect)
    cut = {(level, index): data for (level, index), data in tiles.items()
           if index < -(-(size >> (tlog.TILE_HEIGHT * level)) // tlog.TILE_WIDTH)}
    for (level, index), data in cut.items():
        width = min(tlog.TILE_WIDTH, (size >> (tlog.TILE_HEIGHT * level)) - index * tlog.TILE_WIDTH)
        cut[(level, index)] = data[: width * tlog.HASH_SIZE]
    db_file = load_config(setup.config).server.db_file
    if db_file is None:
        raise BenchError("the dev-init config has no [server] db_file")
    write_tile_file(db_file, cut, size, checkpoint_signer(signer)(size, root))


def start_hit_notary(processes: Processes, directory: Path, name: str, cpu: int,
                     options: dict[str, dict[str, object]],
                     prefill: tuple[int, Tiles] | None = None) -> HitNotary:
    ports = free_ports(HIT_TARGETS + 6)
    api_ports = ports[:HIT_TARGETS]
    setup = new_notary(directory / name, options,
                       [api_ports[0], api_ports[1], *ports[HIT_TARGETS:]])
    add_api_ports(setup.config, api_ports[2:])
    if prefill is not None:
        prefill_log(setup, *prefill)
    notary = start_notary(processes, setup, name, cpu=cpu,
                          log=directory / f"{name}.log")
    with connect(api_ports[0], tls=True, timeout_s=10.0) as sock:
        sha256 = hashlib.sha256(sock.getpeercert(binary_form=True)).hexdigest()
    bodies = {n: query_body(api_ports, sha256, n, nonce=NONCE) for n in HIT_BATCHES}
    https(api_ports[0], "POST", "/v2/query", bodies[HIT_TARGETS])  # probes every target
    https(api_ports[0], "POST", "/v2/query", bodies[HIT_TARGETS])  # signs the statements
    return HitNotary(name, notary, api_ports, bodies, {})


def part_hit(args: argparse.Namespace, processes: Processes, directory: Path, wrk: str,
             server_cpu: int, client_cpu: int, built: tuple[int, Tiles] | None) -> None:
    interval_s = 1.0
    prefill = None
    if args.log_size:
        if built is None or built[0] != args.log_size:
            started = time.perf_counter()
            built = (args.log_size, synthetic_tiles(args.log_size))
            print(f"tiles of a {args.log_size:,}-leaf tree built in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
        prefill = built
    print(f"## 3. A v2 cache hit, log on vs off\n\nTwo dev-init notaries (one worker each, "
          f"both pinned to CPU {server_cpu}; the idle one costs nothing), each asked about "
          f"{HIT_TARGETS} of its own HTTPS API ports (loopback), [rescan] off on both (no "
          "re-probe makes a new statement mid-run); the second with [log] enabled, "
          f"checkpoint_interval_s = {interval_s:g}, its log first made a tree of "
          f"{args.log_size:,} entries (part 2's synthetic tiles written into its database: "
          "its statements are appended after them, with proofs of that tree's length). "
          f"wrk -t{args.threads} -c{args.connections} "
          f"-d{args.duration}s on CPU {client_cpu}, POST /v2/query over HTTPS keep-alive; "
          f"{args.rounds} round(s), interleaved, best kept.\n", flush=True)
    notaries = {
        "off": start_hit_notary(processes, directory, "log-off", server_cpu,
                                {"rescan": {"enabled": False}, "log": {"enabled": False}}),
        "on": start_hit_notary(processes, directory, "log-on", server_cpu, {
            "rescan": {"enabled": False},
            "log": {"enabled": True, "origin": ORIGIN, "checkpoint_interval_s": interval_s}},
            prefill),
    }
    time.sleep(2.5 * interval_s)  # the statements signed above are sequenced
    for key, hit in notaries.items():
        keys = v2.parse_key_document(https(hit.ports[0], "GET", "/v2/key"))
        for n in HIT_BATCHES:
            hit.answers[n] = https(hit.ports[0], "POST", "/v2/query", hit.bodies[n])
            size = check_answer(hit.answers[n], hit.bodies[n], keys, logged=key == "on")
            print(f"log {key}, {n} target(s): answer {len(hit.answers[n]):,} bytes, verified"
                  + (f", every statement with its inclusion proof (tree of {size})"
                     if key == "on" else ""))
    print(flush=True)
    scripts = {(key, n): wrk_script(directory, hit.bodies[n], name=f"{key}-{n}",
                                    content_type=JSON_TYPE)
               for key, hit in notaries.items() for n in HIT_BATCHES}
    rows = [(key, n) for n in HIT_BATCHES for key in ("off", "on")]

    def measure(row: tuple[str, int]) -> Run:
        hit = notaries[row[0]]
        result = run_wrk(
            wrk, processes, f"https://{LOOPBACK}:{hit.ports[0]}/v2/query", scripts[row],
            threads=args.threads, connections=args.connections, seconds=args.duration,
            cpu=client_cpu, server_cpu_seconds=lambda: cpu_seconds(hit.notary.pid),
            cpus=[server_cpu, client_cpu])
        hit.notary.check_alive()
        return result

    runs = run_rounds(args, rows, measure, lambda row, result: (
        f"log {row[0]}, {row[1]} target(s): {result.rate:,.0f} req/s, server "
        f"{result.server_us:.1f} us CPU/req, server core {result.server_busy:.0%} busy, "
        f"client core {result.client_busy:.0%}, other load {result.other_cores:.2f} cores"),
        key=lambda row: row,
        quiet_cpus=[server_cpu, client_cpu])
    # The answers after the runs: the same statements, still with their proofs.
    for key, hit in notaries.items():
        for n in HIT_BATCHES:
            after = https(hit.ports[0], "POST", "/v2/query", hit.bodies[n])
            if len(after) != len(hit.answers[n]):
                print(f"  note: log {key}, {n} target(s): answer {len(after):,} bytes after "
                      f"the runs, {len(hit.answers[n]):,} before")
    print()
    best = {row: best_run(results) for row, results in runs.items()}
    table, verdicts = [], []
    for n in HIT_BATCHES:
        off, on = best[("off", n)], best[("on", n)]
        by_rate, by_cpu = 1 - on.rate / off.rate, on.server_us / off.server_us - 1
        verdicts.append((n, by_rate, by_cpu))
        for key, run in (("off", off), ("on", on)):
            table.append([n, key, " / ".join(f"{r.rate:,.0f}" for r in runs[(key, n)]),
                          f"{run.rate:,.0f}", f"{run.server_us:,.1f}",
                          f"{len(notaries[key].answers[n]):,}",
                          f"{run.server_busy:.0%}" if run.server_busy is not None else "?",
                          f"{statistics.median(r.server_us for r in runs[(key, n)]):,.1f}",
                          f"{run.latency_us.get('p99', 0) / 1000:.1f}",
                          "" if key == "off" else f"{on.rate / off.rate:.1%} / "
                          f"{on.server_us / off.server_us:.1%}"])
    print_table(["targets", "log", "req/s per run", "best req/s", "server CPU us/req",
                 "answer bytes", "server core busy", "CPU us/req, median run", "p99 ms",
                 "on / off: rate / CPU per req"], table)
    for n, by_rate, by_cpu in verdicts:
        met = by_rate < GOAL and by_cpu < GOAL
        print(f"goal (log costs a cache hit < {GOAL:.0%}), {n} target(s): {by_rate:+.1%} by rate, "
              f"{by_cpu:+.1%} by CPU per request: {'met' if met else 'NOT met'}")
    for hit in notaries.values():
        problems = tail(hit.notary.log)
        if problems.strip():
            print(f"notary {hit.name} log (warnings and errors):\n{problems}\n")


# -- the run -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(__doc__.split("\n\n")[0], rounds=3, cpus="the notaries and "
                         "parts 1-2", quick="a few seconds per part: a smoke run, not "
                         "a measurement")
    parser.add_argument("--part", default=",".join(PARTS),
                        help=f"comma-separated parts ({', '.join(PARTS)}; default all)")
    parser.add_argument("--append-seconds", type=float, default=None,
                        help="seconds of appends per run in part 1 (2; quick 0.3)")
    parser.add_argument("--proofs", type=int, default=None,
                        help="proofs per cell in part 2 (1000; quick 100)")
    parser.add_argument("--max-size", type=int, default=None,
                        help="largest tree of part 2 (10,000,000; quick 100,000)")
    parser.add_argument("--log-size", type=int, default=None,
                        help="entries in the logging notary's log before part 3 (synthetic "
                        "tiles; default --max-size; 0: an empty log)")
    args = finish_load_args(parser.parse_args(argv))
    args.parts = [part.strip() for part in args.part.split(",")]
    if not set(args.parts) <= set(PARTS) or not args.parts:
        parser.error(f"--part: choose from {', '.join(PARTS)}")
    for name, full, quick in (("append_seconds", 2.0, 0.3), ("proofs", 1000, 100),
                              ("max_size", SIZES[-1], 100_000)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.log_size is None:
        args.log_size = args.max_size
    return args


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = ensure_wrk() if "hit" in args.parts else None
    server_cpu, client_cpu = start_load(
        args, "The transparency log (issue 22): appends, proofs, a v2 cache hit with the log",
        wrk, lambda server, client: [
            f"parts: {', '.join(args.parts)}; parts 1-2 in this process pinned to CPU {server}; "
            f"part 3: notaries on CPU {server}, wrk on CPU {client}"])
    signer = Ed25519Signer(ed25519.Ed25519PrivateKey.generate())
    affinity = os.sched_getaffinity(0)
    started = time.monotonic()
    built = None
    if "appends" in args.parts or "proofs" in args.parts:
        os.sched_setaffinity(0, {server_cpu})
        try:
            if "appends" in args.parts:
                part_appends(args, directory, signer)
                print(describe_busy([server_cpu, client_cpu], "after part 1"), "\n",
                      flush=True)
            if "proofs" in args.parts:
                built = part_proofs(args, directory, signer)
                print(describe_busy([server_cpu, client_cpu], "after part 2"), "\n",
                      flush=True)
        finally:
            os.sched_setaffinity(0, affinity)
    if "hit" in args.parts:
        assert wrk is not None
        part_hit(args, processes, directory, wrk, server_cpu, client_cpu, built)
        print(describe_busy([server_cpu, client_cpu], "after part 3 (notaries idle)"))
    print(f"took {time.monotonic() - started:.0f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_log", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
