"""The corpus view of the lag service's page (`/corpus`): what the warehouse holds and how fresh
it is, as four JSON panels (docs/metrics.md, "The corpus view").

- `summary`: episodes and hours of video by verdict, by device and by day of recording;
- `rejects`: rejected episodes by reason code, and the latest examples; dead letters likewise;
- `duplicates`: exact and near duplicates (`manifest_episodes.duplicate_of`), latest examples;
- `freshness`: time from an episode's `started_at`, and from its upload, to being in the
  warehouse as sharded: p50 and p99 over the last hour and the last day.

The SQL is built by pure functions (bounded: every list has a LIMIT; the time-windowed reads
ride `ix_episodes_status_updated`), the rows are shaped by pure functions, and `CorpusReader`
is the edge: it runs a panel's queries at most once per `ttl_s` (every open page polls, the
warehouse is asked once) and turns any failure, an unconfigured warehouse included, into an
`error` field. The lag service gets the panels passed in (`services/cli.py`): it sits below
the warehouse's owner in the layer order and never imports it.

Times, and what they stand for:
- *sharded at* is `episodes.updated_at` of an episode whose status is `sharded`: the time the
  metadata service applied the last event that touched the episode, normally its
  `shards.written` (a redelivered event or a backfill's announcement moves it later);
- *uploaded at* is when the metadata service recorded the episode's `episodes.uploaded` event
  (`processed_events.processed_at` of `episode_refs.event_id`). The agent publishes that
  event only after the upload completed; the warehouse does not keep the event's own
  `produced_at`, so this proxy is later than the upload by the metadata service's consume
  delay (its batch wait and lag). An episode announced before migration 0007 has no
  `episode_refs` row: it counts in `from_started_at` only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Select,
    and_,
    create_engine,
    extract,
    func,
    select,
)

from services.common.settings import Settings
from services.common.stats import percentile
from services.metadata.core import EpisodeStatus
from services.metadata.warehouse import (
    dead_letters,
    decode_meta,
    episode_refs,
    episodes,
    manifest_episodes,
    near_duplicates,
    processed_events,
    verdicts,
)
from services.stack.corpus_status import reject_counts_query

log = logging.getLogger("egoline.corpus")

AnySelect = Select[*tuple[Any, ...]]

PANELS = ("summary", "rejects", "duplicates", "freshness")
# the freshness windows, by name
WINDOWS = {"hour": 3600, "day": 86400}
NO_VERDICT = "none"  # no verdict under this pipeline version (not validated yet, or dead-lettered)


@dataclass(frozen=True)
class Limits:
    """How much any panel reads or returns at most."""

    devices: int = 50
    days: int = 31
    examples: int = 10
    # episodes sharded within the longest window read for freshness (beyond: `truncated`)
    freshness_rows: int = 200_000


# --- SQL (pure: statements, no connection) --------------------------------------------------


def _seconds_ago(seconds: int) -> ColumnElement[Any]:
    return func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def grouped_query(key: str, pipeline_version: str, limit: int) -> AnySelect:
    """Episodes and seconds of video grouped by `key` (`verdict`, `device` or `day`: the UTC
    day of `started_at`, latest first), at most `limit` groups. Seconds are the main camera's
    probed duration under this pipeline version (0 until decoded)."""
    verdict = func.coalesce(verdicts.c.verdict, NO_VERDICT)
    day = func.to_char(func.timezone("UTC", episodes.c.started_at), "YYYY-MM-DD")
    columns: dict[str, ColumnElement[Any]] = {
        "verdict": verdict,
        "device": episodes.c.device_id,
        "day": day,
    }
    group = columns[key].label("key")
    n = func.count().label("episodes")
    seconds = func.coalesce(func.sum(decode_meta.c.duration_s), 0.0).label("seconds")
    query = (
        select(group, n, seconds)
        .select_from(episodes)
        .outerjoin(
            decode_meta,
            and_(
                decode_meta.c.episode_id == episodes.c.episode_id,
                decode_meta.c.pipeline_version == pipeline_version,
            ),
        )
    )
    if key == "verdict":
        query = query.outerjoin(
            verdicts,
            and_(
                verdicts.c.episode_id == episodes.c.episode_id,
                verdicts.c.pipeline_version == pipeline_version,
            ),
        )
    order = (group.desc(),) if key == "day" else (seconds.desc(), n.desc(), group)
    return query.group_by(group).order_by(*order).limit(limit)


def totals_query(pipeline_version: str) -> AnySelect:
    """Every episode, its devices and its seconds of video (one row)."""
    return (
        select(
            func.count().label("episodes"),
            func.count(func.distinct(episodes.c.device_id)).label("devices"),
            func.coalesce(func.sum(decode_meta.c.duration_s), 0.0).label("seconds"),
        )
        .select_from(episodes)
        .outerjoin(
            decode_meta,
            and_(
                decode_meta.c.episode_id == episodes.c.episode_id,
                decode_meta.c.pipeline_version == pipeline_version,
            ),
        )
    )


def status_query() -> AnySelect:
    return select(episodes.c.status, func.count()).group_by(episodes.c.status)


def latest_rejects_query(pipeline_version: str, limit: int) -> AnySelect:
    """The latest rejected episodes (by the time they were rejected) with their reasons."""
    return (
        select(
            episodes.c.episode_id,
            episodes.c.device_id,
            episodes.c.started_at,
            episodes.c.updated_at,
            verdicts.c.reasons,
        )
        .select_from(episodes)
        .join(
            verdicts,
            and_(
                verdicts.c.episode_id == episodes.c.episode_id,
                verdicts.c.pipeline_version == pipeline_version,
                verdicts.c.verdict == "reject",
            ),
        )
        .where(episodes.c.status == EpisodeStatus.REJECTED.value)
        .order_by(episodes.c.updated_at.desc(), episodes.c.episode_id)
        .limit(limit)
    )


def dead_letter_counts_query() -> AnySelect:
    """Dead letters of every stage by reason code (most first)."""
    n = func.count()
    return (
        select(dead_letters.c.reason_code, n)
        .group_by(dead_letters.c.reason_code)
        .order_by(n.desc(), dead_letters.c.reason_code)
    )


def latest_dead_letters_query(limit: int) -> AnySelect:
    return (
        select(
            dead_letters.c.episode_id,
            dead_letters.c.stage,
            dead_letters.c.reason_code,
            dead_letters.c.reason,
            dead_letters.c.failed_at,
        )
        .order_by(dead_letters.c.failed_at.desc(), dead_letters.c.event_id)
        .limit(limit)
    )


def duplicate_counts_query(pipeline_version: str) -> AnySelect:
    """Episodes marked duplicates by kind (`exact`, `near`) under this pipeline version."""
    m = manifest_episodes
    return (
        select(m.c.duplicate_kind, func.count())
        .where(m.c.pipeline_version == pipeline_version, m.c.duplicate_of.is_not(None))
        .group_by(m.c.duplicate_kind)
    )


def near_pair_count_query(pipeline_version: str) -> AnySelect:
    """Stored near-duplicate pairs (a pair is stored once, however many it chains)."""
    return select(func.count()).where(near_duplicates.c.pipeline_version == pipeline_version)


def latest_duplicates_query(pipeline_version: str, limit: int) -> AnySelect:
    """The duplicates that arrived last (by the time their episode was last updated, normally
    when it was sharded), with the evidence of a near pair."""
    m, n = manifest_episodes, near_duplicates
    return (
        select(
            m.c.episode_id,
            m.c.duplicate_of,
            m.c.duplicate_kind,
            m.c.device_id,
            m.c.started_at,
            episodes.c.updated_at,
            n.c.shared,
            n.c.min_distance,
        )
        .select_from(m)
        .join(episodes, episodes.c.episode_id == m.c.episode_id)
        .outerjoin(
            n,
            and_(
                n.c.pipeline_version == m.c.pipeline_version,
                n.c.episode_id == m.c.episode_id,
                n.c.duplicate_of == m.c.duplicate_of,
            ),
        )
        .where(m.c.pipeline_version == pipeline_version, m.c.duplicate_of.is_not(None))
        .order_by(episodes.c.updated_at.desc(), m.c.episode_id)
        .limit(limit)
    )


def freshness_query(window_s: int, limit: int) -> AnySelect:
    """Episodes sharded within the last `window_s`, latest first: how long ago (`age_s`), and
    seconds from `started_at` and from the upload (null if unknown) to being sharded."""
    sharded_at = episodes.c.updated_at
    uploaded_at = processed_events.c.processed_at
    return (
        select(
            extract("epoch", func.now() - sharded_at).label("age_s"),
            extract("epoch", sharded_at - episodes.c.started_at).label("from_started_at_s"),
            extract("epoch", sharded_at - uploaded_at).label("from_upload_s"),
        )
        .select_from(episodes)
        .outerjoin(episode_refs, episode_refs.c.episode_id == episodes.c.episode_id)
        .outerjoin(processed_events, processed_events.c.event_id == episode_refs.c.event_id)
        .where(
            episodes.c.status == EpisodeStatus.SHARDED.value,
            sharded_at >= _seconds_ago(window_s),
        )
        .order_by(sharded_at.desc())
        .limit(limit)
    )


# --- shaping (pure) -------------------------------------------------------------------------


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {
        "episodes": len(values),
        "p50_s": _rounded(percentile(values, 50)),
        "p99_s": _rounded(percentile(values, 99)),
    }


@dataclass(frozen=True)
class FreshRow:
    """One sharded episode: seconds since it was sharded, and from its start and its upload."""

    age_s: float
    from_started_at_s: float
    from_upload_s: float | None


def freshness_panel(rows: Sequence[FreshRow], truncated: bool) -> dict[str, Any]:
    """p50 and p99 per window over the episodes sharded within it."""
    windows: dict[str, Any] = {}
    for name, window_s in WINDOWS.items():
        inside = [r for r in rows if r.age_s <= window_s]
        uploads = [r.from_upload_s for r in inside if r.from_upload_s is not None]
        windows[name] = {
            "window_s": window_s,
            "episodes": len(inside),
            "from_started_at": spread([r.from_started_at_s for r in inside]),
            "from_upload": spread(uploads),
        }
    return {"windows": windows, "truncated": truncated}


def grouped_rows(rows: Sequence[Sequence[Any]], key: str) -> list[dict[str, Any]]:
    """(key, episodes, seconds) rows as JSON objects (hours to 5 decimals: 0.04 s)."""
    return [
        {key: str(k), "episodes": int(n), "hours": round(float(s) / 3600, 5)} for k, n, s in rows
    ]


def reasons_json(reasons: Any) -> list[dict[str, str]]:
    """A verdict's stored findings as (code, detail) pairs."""
    out: list[dict[str, str]] = []
    for finding in reasons if isinstance(reasons, list) else []:
        if isinstance(finding, dict):
            out.append({"code": str(finding.get("code")), "detail": str(finding.get("message"))})
    return out


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def _float(value: Decimal | float | None) -> float | None:
    return None if value is None else float(value)


# --- the edge ---------------------------------------------------------------------------------


def summary(engine: Engine, pipeline_version: str, limits: Limits) -> dict[str, Any]:
    with engine.connect() as conn:
        total = conn.execute(totals_query(pipeline_version)).one()
        statuses = conn.execute(status_query()).all()
        groups = {
            key: grouped_rows(conn.execute(grouped_query(key, pipeline_version, limit)).all(), key)
            for key, limit in (
                ("verdict", 16),
                ("device", limits.devices),
                ("day", limits.days),
            )
        }
    by_status = {s.value: 0 for s in EpisodeStatus} | {str(s): int(n) for s, n in statuses}
    return {
        "episodes": int(total.episodes),
        "devices": int(total.devices),
        "hours": round(float(total.seconds) / 3600, 5),
        "by_status": by_status,
        "by_verdict": groups["verdict"],
        "by_device": groups["device"],
        "by_day": groups["day"],
    }


def rejects(engine: Engine, pipeline_version: str, limits: Limits) -> dict[str, Any]:
    with engine.connect() as conn:
        by_reason = conn.execute(reject_counts_query(pipeline_version)).tuples().all()
        latest = conn.execute(latest_rejects_query(pipeline_version, limits.examples)).all()
        dead = conn.execute(dead_letter_counts_query()).all()
        latest_dead = conn.execute(latest_dead_letters_query(limits.examples)).all()
    return {
        "by_reason": {str(code): int(n) for code, n in by_reason},
        "latest": [
            {
                "episode_id": r.episode_id,
                "device_id": r.device_id,
                "started_at": _iso(r.started_at),
                "rejected_at": _iso(r.updated_at),
                "reasons": reasons_json(r.reasons),
            }
            for r in latest
        ],
        "dead_letters": {
            "by_reason": {str(code): int(n) for code, n in dead},
            "latest": [
                {
                    "episode_id": r.episode_id,
                    "stage": r.stage,
                    "reason_code": r.reason_code,
                    "detail": str(r.reason)[:300],
                    "failed_at": _iso(r.failed_at),
                }
                for r in latest_dead
            ],
        },
    }


def duplicates(engine: Engine, pipeline_version: str, limits: Limits) -> dict[str, Any]:
    with engine.connect() as conn:
        counts = conn.execute(duplicate_counts_query(pipeline_version)).all()
        pairs = conn.execute(near_pair_count_query(pipeline_version)).scalar_one()
        latest = conn.execute(latest_duplicates_query(pipeline_version, limits.examples)).all()
    by_kind = {"exact": 0, "near": 0} | {str(kind): int(n) for kind, n in counts}
    return {
        "by_kind": by_kind,
        "near_pairs": int(pairs),
        "latest": [
            {
                "episode_id": r.episode_id,
                "duplicate_of": r.duplicate_of,
                "kind": r.duplicate_kind,
                "device_id": r.device_id,
                "started_at": _iso(r.started_at),
                "updated_at": _iso(r.updated_at),
                "shared": _float(r.shared),
                "min_distance": r.min_distance,
            }
            for r in latest
        ],
    }


def freshness(engine: Engine, limits: Limits) -> dict[str, Any]:
    query = freshness_query(max(WINDOWS.values()), limits.freshness_rows)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    fresh = [
        FreshRow(float(r.age_s), float(r.from_started_at_s), _float(r.from_upload_s)) for r in rows
    ]
    return freshness_panel(fresh, truncated=len(rows) >= limits.freshness_rows)


PanelReader = Callable[[Engine, str, Limits], dict[str, Any]]
READERS: dict[str, PanelReader] = {
    "summary": summary,
    "rejects": rejects,
    "duplicates": duplicates,
    "freshness": lambda engine, _pv, limits: freshness(engine, limits),
}


def corpus_engine(settings: Settings) -> Engine:
    """A small pool that gives up quickly: a page poll must not hang on a dead warehouse."""
    return create_engine(
        settings.database_sqlalchemy_url,
        pool_pre_ping=True,
        pool_size=2,
        max_overflow=0,
        pool_timeout=10,
        connect_args={"connect_timeout": 3, "options": "-c statement_timeout=15000"},
    )


class CorpusReader:
    """The panels, each computed at most once per `ttl_s`; a failure (no warehouse configured,
    unreachable, a query error) is the panel's `error` and is retried after `ttl_s`."""

    def __init__(
        self,
        engine: Callable[[], Engine],
        pipeline_version: str,
        limits: Limits | None = None,
        ttl_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._make_engine = engine
        self._engine: Engine | None = None
        self.pipeline_version = pipeline_version
        self.limits = limits or Limits()
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()  # one panel read at a time, whatever the page count

    def panel(self, name: str) -> dict[str, Any]:
        if name not in READERS:
            raise KeyError(name)
        with self._lock:
            now = self.clock()
            cached = self._cache.get(name)
            if cached is not None and now - cached[0] < self.ttl_s:
                return cached[1]
            payload: dict[str, Any] = {
                "panel": name,
                "pipeline_version": self.pipeline_version,
                "generated_at": now,
                "error": None,
            }
            try:
                self._engine = self._engine or self._make_engine()
                payload |= READERS[name](self._engine, self.pipeline_version, self.limits)
            except Exception as exc:  # the warehouse is down or not configured: say so
                payload["error"] = f"{type(exc).__name__}: {exc}".removesuffix(": ")[:300]
                log.warning("corpus panel %s: %s", name, payload["error"])
            self._cache[name] = (now, payload)
            return payload

    def panels(self) -> dict[str, Callable[[], dict[str, Any]]]:
        """Each panel as a no-argument function (what the lag service's routes take)."""
        return {name: partial(self.panel, name) for name in PANELS}

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


def corpus_reader(settings: Settings, ttl_s: float = 10.0) -> CorpusReader:
    return CorpusReader(lambda: corpus_engine(settings), settings.pipeline_version, ttl_s=ttl_s)
