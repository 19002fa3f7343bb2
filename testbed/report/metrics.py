"""Prometheus text scraping and the little histogram arithmetic a report needs."""

from __future__ import annotations

import functools
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

Labels = frozenset[tuple[str, str]]

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPE = re.compile(r"\\(.)")


class MalformedMetrics(ValueError):
    """A line of a /metrics text that is not the Prometheus text format."""


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value) if "\\" in value else value


def parse_sample(line: str) -> tuple[str, Labels, float]:
    """One sample line of the Prometheus text format: ``name{label="value",...} value
    [timestamp]``. Written for speed: the API server's /metrics has thousands of lines,
    read while the run's watches wait (a general parser took 50 us a line)."""
    brace = line.find("{")
    if brace < 0:
        name, _, rest = line.strip().partition(" ") if " " in line else line.strip().partition("\t")
        labels: Labels = frozenset()
    elif "\\" not in line:  # no escapes: every quote delimits a value
        name, close = line[:brace].strip(), line.rfind("}")
        tokens = line[brace + 1 : close].split('"')
        keys = [key.strip(" ,") for key in tokens[0:-1:2]]
        if close < 0 or len(tokens) % 2 == 0 or not all(key.endswith("=") for key in keys) or tokens[-1].strip(" ,"):
            raise MalformedMetrics(f"bad labels in {line!r}")
        labels, rest = frozenset(zip((key[:-1].rstrip() for key in keys), tokens[1::2], strict=True)), line[close + 1 :]
    else:
        name, position, pairs = line[:brace].strip(), brace + 1, []
        while True:
            while position < len(line) and line[position] == " ":
                position += 1
            if line.startswith("}", position):
                break
            match = _LABEL.match(line, position)
            if match is None:
                raise MalformedMetrics(f"bad labels in {line!r}")
            pairs.append((match.group(1), _unescape(match.group(2))))
            position = match.end()
        labels, rest = frozenset(pairs), line[position + 1 :]
    fields = rest.split()
    try:
        if not name:
            raise ValueError
        return name, labels, float(fields[0])
    except (IndexError, ValueError):
        raise MalformedMetrics(f"no name or value in {line!r}") from None


@dataclass(frozen=True)
class Narrowed:
    """A filter entry for ``Scrape.parse``: the samples whose names start with ``prefix``,
    kept only when their line holds one of ``labels`` (each ``key="value"`` as written).
    So a report that reads four resources of the API server's per-resource histograms
    parses those, not the thousands of lines of all the others."""

    prefix: str
    labels: tuple[str, ...]


Only = tuple[str | Narrowed, ...]


@dataclass
class Scrape:
    """One scrape: sample name -> labels -> value."""

    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)
    failed: str = ""
    """Why the scrape got nothing (unreachable, timed out); "" if it worked."""

    @classmethod
    def parse(cls, text: str, only: Only = ()) -> Scrape:
        """``only``: keep just the samples whose names start with these, or, for a
        ``Narrowed``, those of them with one of its labels (parsing is the costly part, so
        lines are dropped before it). A line that is not the text format raises
        MalformedMetrics."""
        scrape = cls()
        prefixes = tuple(entry if isinstance(entry, str) else entry.prefix for entry in only)
        narrowed = [(entry.prefix, entry.labels) for entry in only if isinstance(entry, Narrowed)]
        counters: set[str] = set()
        """Counters whose name lacks ``_total``: their samples get it, as Prometheus's own
        parser names them (so the name a report asks for never depends on the filter)."""
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                parts = line.split()
                if len(parts) == 4 and parts[3] == "counter" and not parts[2].endswith("_total"):
                    counters.add(parts[2])
                continue
            if not line or line.startswith("#") or (only and not line.startswith(prefixes)):
                continue
            if narrowed and any(line.startswith(p) and not any(x in line for x in xs) for p, xs in narrowed):
                continue
            name, labels, value = parse_sample(line)
            if name in counters:
                name += "_total"
            scrape.samples.setdefault(name, {})[labels] = value
        return scrape

    def value(self, name: str, match: Mapping[str, str]) -> float:
        return sum(v for labels, v in self.samples.get(name, {}).items() if set(match.items()) <= labels)

    def buckets(self, name: str, match: Mapping[str, str]) -> dict[float, float]:
        """Cumulative bucket counts (le -> count) of a histogram, summed over other labels."""
        result: dict[float, float] = {}
        for labels, value in self.samples.get(f"{name}_bucket", {}).items():
            if set(match.items()) <= labels:
                le = float(dict(labels)["le"])
                result[le] = result.get(le, 0.0) + value
        return result


def quantile(q: float, before: Mapping[float, float], after: Mapping[float, float]) -> float | None:
    """histogram_quantile over the increase between two scrapes (linear within a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            width = count - previous_count
            fraction = (rank - previous_count) / width if width else 1.0
            return previous_bound + (bound - previous_bound) * fraction
        previous_bound, previous_count = bound, count
    return previous_bound


COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
START_TIME = "process_start_time_seconds"


def _series(name: str, labels: Labels) -> tuple[str, Labels]:
    """A histogram's buckets, sum and count are one series: they start from zero together."""
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix):
            return name.removesuffix(suffix), frozenset(kv for kv in labels if kv[0] != "le")
    return name, labels


def increase(start: Scrape, end: Scrape) -> tuple[Scrape, bool, set[str]]:
    """What one process counted between two scrapes: counters and histograms as
    increases, gauges as they are at the end. Then whether the process restarted in
    between (its start time changed: it counted from zero, and the increase is what it
    counted since), and the series that started from zero again without it (a counter
    that fell, as Prometheus's increase() reads one: a process whose figures it passes
    on restarted, such as a NodeHost's real kubelet)."""
    restarted = start.value(START_TIME, {}) != end.value(START_TIME, {})
    fell: set[tuple[str, Labels]] = set()
    if not restarted:
        for name, series in end.samples.items():
            if name.endswith(COUNTER_SUFFIXES):
                before = start.samples.get(name, {})
                fell |= {_series(name, labels) for labels, value in series.items() if value < before.get(labels, 0.0)}
    result = Scrape()
    for name, series in end.samples.items():
        counter = name.endswith(COUNTER_SUFFIXES)
        target = result.samples.setdefault(name, {})
        for labels, value in series.items():
            counted_since_start = counter and not restarted and (not fell or _series(name, labels) not in fell)
            target[labels] = value - (start.samples.get(name, {}).get(labels, 0.0) if counted_since_start else 0.0)
    return result, restarted, {_named(name, labels) for name, labels in fell}


def _named(name: str, labels: Labels) -> str:
    """A series as a reader finds it: its name, and its node if it has one."""
    node = dict(labels).get("node")
    return f'{name}{{node="{node}"}}' if node else name


def fleet_increase(before: list[Scrape], after: list[Scrape]) -> tuple[Scrape, str]:
    """What the NodeHosts counted between two scrapes each (hosts in the same order), as
    one scrape (see ``increase``); the reason says why the figures are partial ("" if
    whole): a host not scraped, or restarted and so lost what it counted before."""
    total = Scrape()
    reasons = []
    if len(before) != len(after):
        reasons.append(f"{len(before)} NodeHosts at the start, {len(after)} at the end")
    for index, (start, end) in enumerate(zip(before, after, strict=False)):
        if end.failed or start.failed:
            reasons.append(f"NodeHost {index} not scraped ({end.failed or start.failed})")
            continue
        counted, restarted, reset = increase(start, end)
        if restarted:
            reasons.append(f"NodeHost {index} restarted during the run: what it counted before is lost")
        elif reset:
            reasons.append(
                f"NodeHost {index}: {', '.join(sorted(reset))} started again from zero during the run "
                "(a process it reports for restarted): what they counted before is lost"
            )
        for name, series in counted.samples.items():
            target = total.samples.setdefault(name, {})
            for labels, value in series.items():
                target[labels] = target.get(labels, 0.0) + value
    return total, "; ".join(reasons)


def by_label(scrape: Scrape, name: str, label: str, match: Mapping[str, str] | None = None) -> dict[str, float]:
    """A counter's values summed per value of one label (e.g. attempts by ``result``)."""
    result: dict[str, float] = {}
    for labels, value in scrape.samples.get(name, {}).items():
        if set((match or {}).items()) <= labels:
            key = dict(labels).get(label, "")
            result[key] = result.get(key, 0.0) + value
    return result


def label_sets(scrape: Scrape, name: str, labels: tuple[str, ...]) -> set[tuple[str, ...]]:
    """The combinations of these labels' values that a series has."""
    return {tuple(dict(ls).get(label, "") for label in labels) for ls in scrape.samples.get(name, {})}


def histogram(scrape: Scrape, name: str, match: Mapping[str, str]) -> dict[str, float | None]:
    """Count, total and p50/p99 (seconds) of a histogram in an ``increase`` scrape."""
    count = scrape.value(f"{name}_count", match)
    buckets = scrape.buckets(name, match)
    p50, p99 = quantile(0.5, {}, buckets), quantile(0.99, {}, buckets)
    finite = [bound for bound in buckets if bound != float("inf")]
    return {
        "count": round(count),
        "total_s": round(scrape.value(f"{name}_sum", match), 4),
        "p50_s": None if p50 is None else round(p50, 5),
        "p99_s": None if p99 is None else round(p99, 5),
        "buckets_end_s": max(finite) if finite else None,
    }


def quantile_text(row: Mapping[str, Any], key: str, fmt: Callable[[float | None], str]) -> str:
    """A quantile of a ``histogram`` row as a reader should take it: one that lies past the
    last finite bucket is only known to be at least that bucket's bound (the scheduler's
    extension-point buckets end near 0.2 s, so a PreBind that waited 20 s reads ">= 204.8 ms")."""
    value, end = row.get(key), row.get("buckets_end_s")
    past = value is not None and end is not None and value >= end
    return (">= " if past else "") + fmt(value)


@functools.cache
def _any_certificate() -> ssl.SSLContext:
    """Components serve /metrics with self-signed certificates. Made once: building a
    context reads the system CA bundle, milliseconds of a busy event loop each time."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def scrape(session: aiohttp.ClientSession, url: str, only: Only = ()) -> Scrape:
    """``only``: keep just the samples whose names start with these. Parsing a component's
    whole /metrics takes tens of milliseconds of the event loop, which would delay the
    pod watch and corrupt the latencies it measures; the once-a-second samples need two
    series."""
    try:
        async with session.get(
            url,
            ssl=_any_certificate() if url.startswith("https") else True,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as response:
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Scrape(failed=f"{url}: {type(exc).__name__} {exc}".strip())
    return Scrape.parse(text, only)
