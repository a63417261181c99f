"""A target's certificate history as an SVG chart: one lane per
certificate, labelled with the addresses that served it, one bar per run
of sightings, gaps left empty.

A pure function of a :class:`~notary.model.observations.Timeline` and a time
window. Lanes are ordered by first sighting, oldest on top, so a change of
certificate reads as a step down to the right. A run shorter than
:data:`MIN_RUN_WIDTH` units (one sighting) is drawn that wide, so it stays
visible and clickable. Bounded: at most :data:`MAX_LANES` lanes (the
certificates seen most recently) and :data:`MAX_RUNS_PER_LANE` bars per lane
(the most recent runs); :class:`TimelineChart` says how many were left out.

A lane's label is the certificate's number and hash, and under it the
addresses that served it (the first, and how many more: the full list is in
the label's tooltip and in the page's certificate list). The certificates
of the target's current set (``current``: docs/v2.md, S8) are marked.

The markup uses classes and data attributes only (no ``style``), so it
renders under a CSP without ``'unsafe-inline'``; the stylesheet gives the
colours. Tests and scripts find ``g.lane`` (``data-sha256``, ``data-runs``,
``data-addresses``: the addresses, space-separated; ``data-current``:
``true`` or ``false``; class ``current``) and ``rect.run``
(``data-start``, ``data-end``: Unix seconds).
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from dataclasses import dataclass
from html import escape

from notary.model.observations import Observation, Timeline

__all__ = [
    "MAX_LANES",
    "MAX_RUNS_PER_LANE",
    "TimelineChart",
    "address_line",
    "chart_lanes",
    "timeline_svg",
]

MAX_LANES = 50
MAX_RUNS_PER_LANE = 200
#: Geometry, in SVG user units (the chart scales to its box).
WIDTH = 960
LABEL_WIDTH = 170
RIGHT_MARGIN = 16
LANE_HEIGHT = 36
BAR_HEIGHT = 16
#: Characters of a lane's address line (it stays within the label column).
MAX_LANE_ADDRESS_CHARS = 24
AXIS_HEIGHT = 34
MIN_RUN_WIDTH = 4
TICKS = 5


@dataclass(frozen=True, slots=True)
class TimelineChart:
    """An SVG chart and what it left out."""

    svg: str
    lanes: int
    runs: int
    lanes_left_out: int
    runs_left_out: int


def chart_lanes(timeline: Timeline) -> tuple[Observation, ...]:
    """The observations drawn, in lane order (oldest first sighting on top):
    the :data:`MAX_LANES` most recently seen."""
    shown = timeline.observations[:MAX_LANES]  # newest last_seen first
    return tuple(sorted(shown, key=lambda o: (o.first_seen, o.last_seen, o.certificate.sha256)))


def _x(moment: int, start: int, end: int) -> float:
    span = max(end - start, 1)
    return LABEL_WIDTH + (moment - start) / span * (WIDTH - LABEL_WIDTH - RIGHT_MARGIN)


def _when(moment: int) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _tick_label(moment: int, span_s: int) -> str:
    stamp = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    return stamp.strftime("%H:%M" if span_s <= 86400 else "%Y-%m-%d")


def timeline_svg(
    timeline: Timeline, *, start: int, end: int, label: str,
    current: Collection[bytes] = frozenset(),
) -> TimelineChart:
    """The chart of ``timeline`` over ``start``..``end`` (Unix seconds; runs
    outside are clipped to it). ``label``: the chart's accessible name;
    ``current``: the SHA-256s of the certificates of the current set
    (their lanes are marked)."""
    end = max(end, start + 1)
    lanes = chart_lanes(timeline)
    height = AXIS_HEIGHT + LANE_HEIGHT * max(len(lanes), 1)
    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-labelledby="timeline-title" '
        f'data-start="{start}" data-end="{end}">',
        f'<title id="timeline-title">{escape(label)}</title>',
    ]
    parts += _axis(start, end, height)
    total_runs = runs_left_out = 0
    for index, observation in enumerate(lanes):
        runs = sorted(observation.timespans)
        runs_left_out += max(len(runs) - MAX_RUNS_PER_LANE, 0)
        lane, drawn = _lane(
            index, observation, runs[-MAX_RUNS_PER_LANE:], start, end,
            observation.certificate.sha256 in current,
        )
        parts += lane
        total_runs += drawn
    parts.append("</svg>")
    return TimelineChart(
        svg="".join(parts),
        lanes=len(lanes),
        runs=total_runs,
        lanes_left_out=len(timeline.observations) - len(lanes),
        runs_left_out=runs_left_out,
    )


def _axis(start: int, end: int, height: int) -> list[str]:
    parts = ['<g class="axis" aria-hidden="true">']
    for step in range(TICKS):
        moment = start + (end - start) * step // (TICKS - 1)
        x = _x(moment, start, end)
        anchor = "start" if step == 0 else "end" if step == TICKS - 1 else "middle"
        parts.append(
            f'<line class="tick" x1="{x:.1f}" y1="{AXIS_HEIGHT - 8}" x2="{x:.1f}" y2="{height}"/>'
            f'<text class="tick-label" x="{x:.1f}" y="{AXIS_HEIGHT - 14}" '
            f'text-anchor="{anchor}">{escape(_tick_label(moment, end - start))}</text>'
        )
    parts.append("</g>")
    return parts


def address_line(addresses: tuple[str, ...]) -> str:
    """A lane's address line: the first address, and ``+N`` for the others;
    cut to :data:`MAX_LANE_ADDRESS_CHARS` (an IPv6 address is longer)."""
    if not addresses:
        return "no address recorded"
    more = f" +{len(addresses) - 1}" if len(addresses) > 1 else ""
    first = addresses[0]
    room = MAX_LANE_ADDRESS_CHARS - len(more)
    if len(first) > room:
        first = first[: room - 1] + "…"
    return first + more


def _lane(
    index: int, observation: Observation, runs: list[tuple[int, int]], start: int, end: int,
    current: bool = False,
) -> tuple[list[str], int]:
    """The markup of lane ``index`` and how many bars it has (runs wholly
    outside the window have none)."""
    sha256 = observation.certificate.sha256.hex()
    addresses = observation.addresses
    top = AXIS_HEIGHT + index * LANE_HEIGHT
    middle = top + LANE_HEIGHT / 2
    bar_top = middle - BAR_HEIGHT / 2
    bars = []
    for run_start, run_end in runs:
        clipped_start, clipped_end = max(run_start, start), min(run_end, end)
        if clipped_end < clipped_start:
            continue
        x = _x(clipped_start, start, end)
        width = max(_x(clipped_end, start, end) - x, MIN_RUN_WIDTH)
        x = min(x, WIDTH - RIGHT_MARGIN - width)
        bars.append(
            f'<rect class="run" x="{x:.1f}" y="{bar_top:.1f}" width="{width:.1f}" '
            f'height="{BAR_HEIGHT}" rx="2" data-start="{run_start}" data-end="{run_end}">'
            f"<title>certificate #{index + 1} seen {escape(_when(run_start))} to "
            f"{escape(_when(run_end))}</title></rect>"
        )
    served = ", ".join(addresses) or "no address recorded"
    state = "currently served" if current else "not currently served"
    parts = [
        f'<g class="lane lane-{index % 6}{" current" if current else ""}" '
        f'data-sha256="{sha256}" data-runs="{len(bars)}" '
        f'data-addresses="{escape(" ".join(addresses))}" '
        f'data-current="{"true" if current else "false"}">',
        f'<a href="#cert-{sha256[:16]}">'
        f"<title>certificate #{index + 1}, {state}, served from {escape(served)}</title>"
        f'<text class="lane-label" x="8" y="{middle - 3:.1f}">'
        f"#{index + 1} {sha256[:12].upper()}…</text>"
        f'<text class="lane-addresses" x="8" y="{middle + 11:.1f}">'
        f"{escape(address_line(addresses))}</text></a>",
        f'<line class="lane-track" x1="{LABEL_WIDTH}" y1="{middle:.1f}" '
        f'x2="{WIDTH - RIGHT_MARGIN}" y2="{middle:.1f}"/>',
        *bars,
        "</g>",
    ]
    return parts, len(bars)
