"""One serving process from start to exit: a single-process node under
systemd, or one worker under the supervisor (``notary.node.supervisor``).
Both report to ``$NOTIFY_SOCKET`` the same way; for a worker it is the
supervisor's socket, not systemd's.

* ``READY=1`` once every listener accepts and the stored-targets filter is
  loaded from the store (the listeners already serve while it loads: it
  answers "maybe" until then, which only costs store reads);
* ``WATCHDOG=1`` and ``STATUS=<figures>`` every ``watchdog_interval_s()``
  (half of ``$WATCHDOG_USEC``), but only while the writer is healthy: a
  writer with rows queued that committed nothing since the previous beat
  (a failing disk, a database locked for good) stops the beats, and the
  manager restarts the process when its watchdog period passes;
* on SIGTERM or SIGINT: ``STOPPING=1``, then ``RunningNotary.stop_gracefully``
  (stop accepting, finish what is in progress for up to
  ``[node] graceful_timeout_s``), then the writer commits everything queued
  and the process exits 0. SIGHUP reloads what ``app.Reloader`` can
  change without a restart (in ``serve_notary``).

Resource handling: ``run_serving_process`` owns the listening sockets it is
given (closed by ``serve_notary``) and the notification socket.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from functools import partial

import trio

from notary.config import Config
from notary.node.systemd import Notifier, watchdog_interval_s
from notary.server.app import RunningNotary, serve_notary
from notary.server.sockets import Sockets

log = logging.getLogger(__name__)


async def run_serving_process(
    config: Config, sockets: Sockets, reload_config: Callable[[], Config] | None = None,
    *, shared_store: bool = False, ticket_keys: bytes | None = None,
) -> None:
    """Serve on ``sockets`` until SIGTERM/SIGINT, then stop gracefully;
    ``reload_config`` reads the configuration again on SIGHUP;
    ``shared_store`` and ``ticket_keys``: a worker of a node (see ``serve_notary``)."""
    with Notifier() as notifier:
        async with trio.open_nursery() as nursery:
            running: RunningNotary = await nursery.start(
                partial(serve_notary, config, sockets=sockets, reload_config=reload_config,
                        shared_store=shared_store, ticket_keys=ticket_keys)
            )
            # Ready once the stored-targets filter is loaded too (it answers
            # "maybe" until then: store reads for every miss).
            await running.stored.settled.wait()
            notifier.notify("READY=1", f"STATUS={status_line(running)}")
            # Its own nursery: cancelling the heartbeat must not cancel
            # serve_notary, whose writer still has to drain.
            async with trio.open_nursery() as helpers:
                interval_s = watchdog_interval_s()
                if interval_s is not None:
                    helpers.start_soon(heartbeat, running, notifier, interval_s)
                signum = await next_stop_signal()
                log.info("received %s, stopping (up to %gs for connections in progress)",
                         signal.Signals(signum).name, config.node.graceful_timeout_s)
                notifier.notify("STOPPING=1")
                await running.stop_gracefully(config.node.graceful_timeout_s)
                helpers.cancel_scope.cancel()
        log.info("stopped: %d observations committed",
                 running.storage.statistics().committed)


async def next_stop_signal() -> int:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            return signum
    raise AssertionError("signal receivers never end")


async def heartbeat(running: RunningNotary, notifier: Notifier, interval_s: float) -> None:
    """``WATCHDOG=1`` every ``interval_s`` while the writer keeps up."""
    committed = running.storage.statistics().committed
    while True:
        await trio.sleep(interval_s)
        statistics = running.storage.statistics()
        stuck = statistics.queued > 0 and statistics.committed == committed
        committed = statistics.committed
        if stuck:
            log.warning("writer made no progress in %gs (%d rows queued): no watchdog beat",
                        interval_s, statistics.queued)
            notifier.notify(f"STATUS=writer stuck, {statistics.queued} rows queued")
            continue
        notifier.notify("WATCHDOG=1", f"STATUS={status_line(running)}")


def status_line(running: RunningNotary) -> str:
    """Live figures for ``systemctl status``."""
    cache = running.cache.statistics()
    probes = running.prober.statistics()
    storage = running.storage.statistics()
    return (
        f"cache {cache.entries} targets ({cache.hits} hits, {cache.misses} misses), "
        f"probes {probes.started} ({probes.in_flight} in flight), "
        f"{storage.committed} observations committed, {storage.queued} queued"
    )
