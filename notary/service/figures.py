"""Live figures for people: queries/s, cache hit rate, probes/s, targets
known and uptime, for the web page (``/``) and the WebSocket's ``figures``
subscription.

The figures come from the node's metric totals
(:meth:`notary.server.metrics.NotaryMetrics.node_totals`), so under
``--workers N`` they are node-wide (the other workers' values as old as
their last fold, at most ``[admin] metrics_interval_s``). Two samples make
the rates: each figure is over the time since the previous sample (since
the notary started, for the first one). :class:`LiveFigures` samples at
most once per ``min_interval_s`` whoever asks (page views, the push loop),
one sample at a time, so viewers cannot make it read the metrics more often.

``targets_known``: targets the rescan scheduler keeps fresh (None when
rescanning is off). ``cache_hit_ratio``: cache lookups that hit, over the
interval (None without lookups); lookups, not queries (see
``notary.server.metrics``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import trio

__all__ = ["FIGURE_KEYS", "MIN_SAMPLE_INTERVAL_S", "LiveFigures", "figures_between"]

#: The metrics are read at most this often for the figures.
MIN_SAMPLE_INTERVAL_S = 1.0
#: The keys of a figures document, in display order.
FIGURE_KEYS = ("queries_per_s", "cache_hit_ratio", "probes_per_s", "targets_known", "uptime_s")

Totals = Mapping[str, float]
Figures = dict[str, float | None]


def figures_between(previous: Totals | None, current: Totals, seconds: float) -> Figures:
    """The figures from the totals ``previous`` (None: the first sample,
    rates since start) to ``current``, ``seconds`` apart. Counters that
    went back (a process restarted in the one-process mode) count from 0."""
    if previous is None:
        previous, seconds = {}, current.get("uptime_s", 0.0)

    def delta(key: str) -> float:
        now, before = current.get(key, 0.0), previous.get(key, 0.0)
        return now - before if now >= before else now

    def rate(key: str) -> float:
        return round(delta(key) / seconds, 3) if seconds > 0 else 0.0

    lookups = delta("cache_hits") + delta("cache_misses")
    return {
        "queries_per_s": rate("queries"),
        "cache_hit_ratio": round(delta("cache_hits") / lookups, 4) if lookups else None,
        "probes_per_s": rate("probes"),
        "targets_known": current.get("targets_known"),
        "uptime_s": current.get("uptime_s"),
    }


class LiveFigures:
    """The latest figures, sampled from ``read_totals`` at most once per
    ``min_interval_s`` (Trio time).

    Resource handling: owns nothing but the previous sample. Error handling:
    whatever ``read_totals`` raises propagates (it reads counters: nothing
    is expected)."""

    def __init__(
        self, read_totals: Callable[[], Awaitable[Totals]], *, min_interval_s: float
    ) -> None:
        self._read_totals = read_totals
        self._min_interval_s = min_interval_s
        self._lock = trio.Lock()
        self._totals: Totals | None = None
        self._sampled_at = 0.0
        self._latest: Figures | None = None

    async def current(self) -> Figures:
        """The figures, sampled now unless the latest is recent enough."""
        async with self._lock:
            now = trio.current_time()
            if self._latest is not None and now - self._sampled_at < self._min_interval_s:
                return self._latest
            totals = dict(await self._read_totals())
            self._latest = figures_between(self._totals, totals, now - self._sampled_at)
            self._totals, self._sampled_at = totals, now
            return self._latest
