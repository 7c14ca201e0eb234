"""What `egoline status` and `up`'s live view show of the warehouse: episodes per state,
what was sharded in the last minute (throughput), and rejects by reason code."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Engine, Select, func, literal_column, select

from services.common.settings import Settings
from services.metadata.core import EpisodeStatus
from services.metadata.warehouse import decode_meta, episodes, make_engine, verdicts

THROUGHPUT_WINDOW_S = 60


def episode_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(episodes.c.status, func.count()).group_by(episodes.c.status)
        ).all()
    counts = {s.value: 0 for s in EpisodeStatus}
    counts.update({str(status): int(n) for status, n in rows})
    return counts


def throughput(engine: Engine, pipeline_version: str) -> dict[str, float]:
    """Episodes (and hours of video) that reached `sharded` in the last minute. An episode's
    `updated_at` is the time of its last status change, and `sharded` is terminal."""
    since = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, THROUGHPUT_WINDOW_S)
    query = (
        select(func.count(), func.coalesce(func.sum(decode_meta.c.duration_s), 0.0))
        .select_from(episodes)
        .join(
            decode_meta,
            (decode_meta.c.episode_id == episodes.c.episode_id)
            & (decode_meta.c.pipeline_version == pipeline_version),
        )
        .where(episodes.c.status == EpisodeStatus.SHARDED.value, episodes.c.updated_at >= since)
    )
    with engine.connect() as conn:
        n, seconds = conn.execute(query).one()
    return {
        "window_s": THROUGHPUT_WINDOW_S,
        "episodes_per_min": int(n) * 60 / THROUGHPUT_WINDOW_S,
        "video_hours_per_hour": round(float(seconds) / THROUGHPUT_WINDOW_S, 3),
    }


def reject_counts_query(pipeline_version: str) -> Select[str, int]:
    """Rejected verdicts of this pipeline version, counted by each reason code they carry
    (most first)."""
    reason = func.jsonb_array_elements(verdicts.c.reasons).table_valued("value").alias("r")
    code: ColumnElement[str] = literal_column("r.value ->> 'code'")
    query = (
        select(code, func.count())
        .select_from(verdicts)
        .join(reason, literal_column("true"))
        .where(verdicts.c.verdict == "reject")
        .where(verdicts.c.pipeline_version == pipeline_version)
        .group_by(code)
        .order_by(func.count().desc(), code)
    )
    return query


def rejects_by_reason(engine: Engine, pipeline_version: str) -> dict[str, int]:
    """Rejected verdicts of this pipeline version, counted by each reason code they carry."""
    with engine.connect() as conn:
        rows = conn.execute(reject_counts_query(pipeline_version)).tuples().all()
    return {str(c): int(n) for c, n in rows}


def warehouse_status(settings: Settings) -> dict[str, Any]:
    try:
        engine = make_engine(settings)
        try:
            return {
                "episodes": episode_counts(engine),
                "throughput": throughput(engine, settings.pipeline_version),
                "rejects": rejects_by_reason(engine, settings.pipeline_version),
            }
        finally:
            engine.dispose()
    except Exception as exc:  # the warehouse is down or not configured: say so, keep going
        return {"warehouse_error": f"{type(exc).__name__}: {exc}"[:300]}
