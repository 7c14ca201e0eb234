"""Near duplicates (bands, Hamming distance, probes, the rule), the SQL the metadata service
builds from signals and clip quality, and the curation manifest filters, without a database."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ClauseElement
from typer.testing import CliRunner

from schemas.events import (
    TOPIC_SHARDS,
    TOPIC_VALIDATED,
    ClipQuality,
    ClipRecord,
    EpisodeDecoded,
    EpisodeRef,
    EpisodeSignals,
    EpisodeValidated,
    ShardsWritten,
    SourceFile,
    StreamInfo,
    StreamSignals,
    Verdict,
)
from services.common.settings import CurationSettings
from services.manifest.query import ExposureBounds, ManifestFilter, build_query
from services.metadata.core import statements_for
from services.metadata.duplicates import (
    BAND_MASK,
    BANDS,
    bands,
    hamming,
    is_near_duplicate,
    phash_int64,
    probe_masks,
    probe_radius,
    shared_fraction,
    signature,
    summarize,
)

u64 = st.integers(min_value=0, max_value=2**64 - 1)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def flip(h: int, bits: list[int]) -> int:
    for bit in bits:
        h ^= 1 << bit
    return h


def test_a_phash_is_a_signed_bigint_and_hamming_counts_differing_bits() -> None:
    assert phash_int64("0000000000000001") == 1
    assert phash_int64("ffffffffffffffff") == -1
    assert phash_int64("8000000000000000") == -(2**63)
    assert hamming(-1, 0) == 64 and hamming(phash_int64("00000000000000ff"), 0) == 8
    with pytest.raises(ValueError, match="16 hex digits"):
        phash_int64("abc")


@given(u64)
def test_bands_cut_the_hash_into_four_16_bit_values_low_band_first(h: int) -> None:
    values = bands(h)
    assert len(values) == BANDS and all(0 <= v <= BAND_MASK for v in values)
    assert sum(v << (16 * i) for i, v in enumerate(values)) == h
    # The signed form (as stored) gives the same bands: the SQL masks after the shift.
    signed = h - 2**64 if h >= 2**63 else h
    assert bands(signed) == values


def test_probe_masks_are_every_16_bit_mask_within_the_radius() -> None:
    assert probe_radius(10) == 2 and probe_radius(3) == 0 and probe_radius(64) == 16
    masks = probe_masks(2)
    assert len(masks) == 1 + 16 + 120 == len(set(masks))
    assert all(m.bit_count() <= 2 and m <= BAND_MASK for m in masks)
    assert probe_masks(0) == [0]


@given(u64, st.lists(st.integers(0, 63), unique=True, max_size=10))
def test_any_hash_within_the_distance_is_reached_by_a_probe(h: int, bits: list[int]) -> None:
    """The index has no false negatives: within r = 10, some band differs by at most 2 bits,
    so one of the probes (band value XOR a mask) is exactly the other hash's band value."""
    other = flip(h, bits)
    assert hamming(h, other) == len(bits) <= 10
    masks = set(probe_masks(probe_radius(10)))
    probes = {(band, value ^ m) for band, value in enumerate(bands(h)) for m in masks}
    assert any((band, value) in probes for band, value in enumerate(bands(other)))


def test_the_guarantee_is_the_pigeonhole_one_and_ends_past_it() -> None:
    """11 bits (3, 3, 3, 2 per band) still leave one band within 2 bits; 12 bits, 3 in every
    band, reach no probe of radius 2 (and the rule would refuse them anyway)."""
    h = 0
    other = flip(h, [0, 1, 2, 16, 17, 18, 32, 33, 34, 48, 49])
    masks = set(probe_masks(2))
    probes = {(band, value ^ m) for band, value in enumerate(bands(h)) for m in masks}
    assert (3, bands(other)[3]) in probes  # the 4th band differs by 2 bits: still reached
    three = flip(h, [0, 1, 2, 16, 17, 18, 32, 33, 34, 48, 49, 50])  # 12 bits, 3 per band
    assert not any((b, v) in probes for b, v in enumerate(bands(three)))


def test_the_rule_takes_the_shorter_signature_and_is_symmetric() -> None:
    rng = random.Random(3)
    a = [rng.getrandbits(64) for _ in range(10)]
    trimmed = [flip(h, [1, 20, 40]) for h in a[2:6]]  # 4 frames, each 3 bits off
    assert shared_fraction(trimmed, a, 10) == shared_fraction(a, trimmed, 10) == 1.0
    assert is_near_duplicate(trimmed, a, 10, 0.5)
    half = trimmed[:2] + [rng.getrandbits(64) for _ in range(3)]  # 2 of 5 match
    assert shared_fraction(half, a, 10) == pytest.approx(0.4)
    assert not is_near_duplicate(half, a, 10, 0.5)
    far = [flip(h, list(range(0, 56, 4))) for h in a]  # 14 bits off each
    assert shared_fraction(far, a, 10) == 0.0 and shared_fraction(far, a, 14) == 1.0
    assert shared_fraction([], a, 10) == 0.0


def stream_signals(phash: list[str], std: list[float], sharp: list[float]) -> StreamSignals:
    n = len(phash)
    return StreamSignals(
        camera="main",
        stream_index=0,
        t_s=[float(i) for i in range(n)],
        sharpness=sharp,
        mean_luma=[100.0] * n,
        std_luma=std,
        highlights=[0.1] * n,
        shadows=[0.2] * n,
        phash=phash,
        still_spans_s=[(1.0, 2.5)],
    )


def test_uniform_frames_leave_no_signature_and_the_summary_counts_them() -> None:
    signals = EpisodeSignals(
        sample_s=1.0,
        streams=[
            stream_signals(
                ["8000000000000000", "00000000000000ff", "8000000000000000"],
                [0.5, 30.0, 1.9],
                [1.0, 9.0, 4.0],
            )
        ],
    )
    assert signature(signals) == [255]  # only the textured frame
    summary = summarize(signals)
    assert (summary.frames, summary.informative_frames) == (3, 1)
    assert (summary.min_sharpness, summary.median_sharpness) == (1.0, 4.0)
    assert summary.still_s == 1.5 and summary.max_shadows == 0.2


def ref(episode_id: str = "ep1") -> EpisodeRef:
    return EpisodeRef(
        episode_id=episode_id,
        device_id="dev1",
        session_id="s1",
        started_at=T0,
        video=SourceFile(key="raw/dev1/v.mp4", sha256="a" * 64, size_bytes=1),
    )


def compiled(statements: list[Any]) -> list[str]:
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return [str(cast(ClauseElement, s).compile(dialect=dialect)) for s in statements]


def validated(signals: EpisodeSignals | None, episode_id: str = "ep1") -> bytes:
    stream = StreamInfo(
        index=0, codec="h264", width=64, height=48, fps=30.0, duration_s=3.0,
        frame_count=90, keyframe_count=1,
    )  # fmt: skip
    decoded = EpisodeDecoded(
        event_id="2" * 32,
        produced_at=T0,
        episode=ref(episode_id),
        container_format="mp4",
        container_complete=True,
        duration_s=3.0,
        streams=[stream],
        primary_stream=0,
        keyframe_times_s=[0.0],
        observed_sha256="a" * 64,
    )
    return (
        EpisodeValidated(
            event_id="3" * 32,
            produced_at=T0,
            decoded=decoded,
            verdict=Verdict.ACCEPT,
            signals=signals,
        )
        .model_dump_json()
        .encode()
    )


def test_validated_signals_store_summary_bands_and_pairs_with_bound_values() -> None:
    signals = EpisodeSignals(
        sample_s=1.0, streams=[stream_signals(["00000000000000ff"], [30.0], [5.0])]
    )
    hostile = "ep1-DROP_TABLE--x"
    upserts = statements_for(
        TOPIC_VALIDATED, validated(signals, hostile), "session", 0.1, CurationSettings()
    )
    sql = compiled(upserts.statements)
    assert any(s.startswith("INSERT INTO episode_quality") for s in sql)
    assert any(s.startswith("DELETE FROM phash_bands") for s in sql)
    assert any("INSERT INTO phash_bands" in s for s in sql)
    assert any(s.startswith("DELETE FROM near_duplicates") for s in sql)
    near = next(s for s in sql if "INSERT INTO near_duplicates" in s)
    assert "bit_count" in near and "phash_bands p" in near and hostile not in near
    assert all(hostile not in s for s in sql)  # ids are bound, never SQL text
    # No signals (an older validator): none of it.
    plain = compiled(statements_for(TOPIC_VALIDATED, validated(None), "session", 0.1).statements)
    assert not any("phash_bands" in s or "near_duplicates" in s for s in plain)


def test_clip_quality_is_stored_in_the_clip_columns() -> None:
    clip = ClipRecord(
        clip_key="ep1_00000", episode_id="ep1", clip_index=0, start_s=0.0, duration_s=2.0,
        frame_count=60, mp4_offset=512, mp4_length=100, json_offset=700, json_length=50,
        quality=ClipQuality(sharpness=12.5, frozen_fraction=0.25, motion=None),
    )  # fmt: skip
    event = ShardsWritten(
        event_id="4" * 32,
        produced_at=T0,
        shard_key="shards/v1/ab/x.tar",
        index_key="shards/v1/ab/x.index.json",
        shard_sha256="b" * 64,
        size_bytes=1024,
        episodes=[ref()],
        clips=[clip, clip.model_copy(update={"clip_key": "ep1_00001", "quality": None})],
    )
    statements = statements_for(
        TOPIC_SHARDS, event.model_dump_json().encode(), "session", 0.1
    ).statements
    inserts = [s for s in compiled(statements) if s.startswith("INSERT INTO clips")]
    assert len(inserts) == 2 and all("sharpness" in s and "quality" not in s for s in inserts)
    params = [
        cast(ClauseElement, s).compile(dialect=postgresql.dialect()).params  # type: ignore[no-untyped-call]
        for s in statements
        if compiled([s])[0].startswith("INSERT INTO clips")
    ]
    assert params[0]["sharpness"] == 12.5 and params[0]["frozen_fraction"] == 0.25
    assert params[0]["motion"] is None and params[1]["sharpness"] is None


def test_curation_filters_are_bound_parameters_in_the_one_query() -> None:
    bounds = ExposureBounds.of(CurationSettings())
    flt = ManifestFilter(
        min_sharpness=50.0,
        max_frozen_fraction=0.2,
        exposure_ok=bounds,
        min_motion=0.05,
        exclude_duplicates=True,
        devices=["dev1'; DROP TABLE clips; --"],
    )
    sql, params = build_query(flt)
    assert "DROP" not in sql and sql.count("$") == len(params)
    for clause in (
        "m.min_sharpness >= $",
        "m.max_frozen_fraction <= $",
        "m.max_highlights <= $",
        "m.max_shadows <= $",
        "m.min_mean_luma >= $",
        "m.max_mean_luma <= $",
        "m.min_motion >= $",
        "m.duplicate_of IS NULL",
    ):
        assert clause in sql, clause
    assert {50.0, 0.2, 0.05, bounds.max_highlights, bounds.min_mean_luma} <= set(
        p for p in params if isinstance(p, float)
    )
    assert sql.rstrip().endswith("ORDER BY m.pipeline_version, m.episode_id")
    # No curation filter: none of it in the query.
    plain, _ = build_query(ManifestFilter())
    assert "min_sharpness" not in plain.split("FROM")[1] and "duplicate_of IS" not in plain


@pytest.mark.parametrize(
    "bad",
    [
        {"min_sharpness": -1.0},
        {"max_frozen_fraction": 1.5},
        {"min_motion": "0.1; DROP TABLE clips"},
        {"min_sharpness": "nan'"},
        {"exclude_duplicates": "yes; --"},
        {"exposure_ok": {"max_highlights": 2, "max_shadows": 0, "min_mean_luma": 0,
                         "max_mean_luma": 1}},
    ],
)  # fmt: skip
def test_hostile_curation_filter_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ManifestFilter.model_validate(bad)


def test_manifest_build_options_become_the_filter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from services.cli import app

    seen: list[ManifestFilter] = []

    class Stop(Exception):
        pass

    def fake_build(*args: object, **kwargs: object) -> None:
        seen.append(cast(ManifestFilter, args[3]))
        raise Stop

    monkeypatch.setattr("services.manifest.build.build_manifest", fake_build)
    monkeypatch.setattr("services.metadata.warehouse.make_engine", lambda _s: None)
    monkeypatch.setattr("services.common.objectstore.object_store", lambda _s: None)
    monkeypatch.setenv("EGOLINE_CURATION_MAX_HIGHLIGHTS", "0.15")
    # a warehouse URL that is never dialled (the build is faked): the test needs no stack
    monkeypatch.setenv("EGOLINE_DATABASE_URL", "postgresql://egoline@127.0.0.1:9/unused")
    monkeypatch.setenv("EGOLINE_EMBEDDED_STACK", "true")
    from services.common.settings import reset_settings_cache

    reset_settings_cache()
    try:
        result = CliRunner().invoke(
            app,
            [
                "manifest", "build", "--out", str(tmp_path), "--min-sharpness", "40",
                "--max-frozen-fraction", "0.3", "--exposure-ok", "--exclude-duplicates",
                "--min-motion", "0.02",
            ],
        )  # fmt: skip
    finally:
        reset_settings_cache()
    assert isinstance(result.exception, Stop), result.output
    (flt,) = seen
    assert (flt.min_sharpness, flt.max_frozen_fraction, flt.min_motion) == (40.0, 0.3, 0.02)
    assert flt.exclude_duplicates and flt.exposure_ok is not None
    assert flt.exposure_ok.max_highlights == 0.15  # the configured bound, recorded
