"""Curation's opt-in reject mode: one pure decision of an episode's content classes from its
worst clip (`media.content.content_classes`), the one the benchmark scores; validate rejects
with `content_<class>` only for the classes `EGOLINE_CURATION_REJECT` lists (none by default),
judged on the windows the shard stage will cut."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from schemas.events import (
    ClipQuality,
    ContentClass,
    EpisodeSignals,
    ReasonCode,
    StreamSignals,
    Verdict,
)
from services.bench.curate import EpisodeFacts, predict
from services.common.settings import CurationSettings, Settings
from services.media.content import ContentThresholds, EpisodeContent, content_classes
from services.sensors.imu import ImuSamples
from services.validate.app import rules_from
from services.validate.content import clip_qualities, episode_content
from services.validate.rules import RuleSet, evaluate
from tests.unit.test_rules import GOOD_KEYFRAMES, decoded

CLEAN = ClipQuality(
    sharpness=900.0,
    mean_luma=120.0,
    highlights=0.01,
    shadows=0.02,
    frozen_fraction=0.0,
    blocked_fraction=0.0,
    motion=0.4,
)


def content(*worst: ClipQuality) -> EpisodeContent:
    """A 3-clip episode: two clean clips and `worst`."""
    return EpisodeContent.of_clips([CLEAN, *worst, CLEAN])


def clip(**values: object) -> ClipQuality:
    return CLEAN.model_copy(update=values)


EACH_CLASS = [
    (clip(blocked_fraction=0.8, mean_luma=6.0, shadows=0.9, sharpness=1.0), {"covered"}),
    (clip(highlights=0.48), {"overexposed"}),
    (clip(mean_luma=240.0), {"overexposed"}),
    (clip(shadows=0.9, mean_luma=10.0), {"underexposed"}),
    (clip(mean_luma=20.0), {"underexposed"}),
    (clip(sharpness=8.0), {"blur"}),
    (clip(frozen_fraction=0.45), {"frozen"}),
    (clip(frozen_fraction=0.9, motion=0.002), {"static"}),  # at rest: not frozen
    (clip(motion=0.002), {"static"}),
    (clip(frozen_fraction=0.45, motion=None), {"frozen"}),  # no IMU: frozen
    (clip(), set()),
]


@pytest.mark.parametrize(("worst", "classes"), EACH_CLASS)
def test_each_content_class_is_decided_from_the_worst_clip(
    worst: ClipQuality, classes: set[str]
) -> None:
    decided = content_classes(content(worst), ContentThresholds())
    assert {c.value for c in decided} == classes


def test_the_benchmark_predicts_by_the_same_decision_plus_the_duplicate_mark() -> None:
    for worst, classes in EACH_CLASS:
        facts = EpisodeFacts("e", content(worst), duplicate_of=None)
        assert predict(facts, ContentThresholds()) == classes
    marked = EpisodeFacts("e", content(clip()), duplicate_of="original")
    assert predict(marked, ContentThresholds()) == {"duplicate"}


def test_thresholds_default_to_the_settings_defaults_and_follow_them() -> None:
    assert ContentThresholds.of(CurationSettings()) == ContentThresholds()
    blurry = content(clip(sharpness=150.0))
    assert content_classes(blurry, ContentThresholds()) == set()
    stricter = ContentThresholds.of(CurationSettings(min_sharpness=200.0))
    assert content_classes(blurry, stricter) == {ContentClass.BLUR}


def every_class_at_once() -> EpisodeContent:
    return content(clip(blocked_fraction=0.9), clip(frozen_fraction=0.5), clip(sharpness=5.0))


def test_the_default_flag_only_mode_rejects_nothing() -> None:
    worst = every_class_at_once()
    assert content_classes(worst, ContentThresholds())  # flagged...
    verdict, reasons, _ = evaluate(decoded(), GOOD_KEYFRAMES, RuleSet(), content=worst)
    assert (verdict, reasons) == (Verdict.ACCEPT, [])  # ...not rejected


@pytest.mark.parametrize(
    ("listed", "worst", "codes"),
    [
        ({"covered"}, clip(blocked_fraction=0.9), [ReasonCode.CONTENT_COVERED]),
        ({"frozen"}, clip(frozen_fraction=0.5), [ReasonCode.CONTENT_FROZEN]),
        ({"overexposed"}, clip(highlights=0.6), [ReasonCode.CONTENT_OVEREXPOSED]),
        ({"underexposed"}, clip(mean_luma=12.0), [ReasonCode.CONTENT_UNDEREXPOSED]),
        ({"blur"}, clip(sharpness=5.0), [ReasonCode.CONTENT_BLUR]),
        ({"static"}, clip(motion=0.001), [ReasonCode.CONTENT_STATIC]),
        # a class not listed is flagged only
        ({"covered"}, clip(frozen_fraction=0.5), []),
        (
            {"blur", "frozen"},
            clip(frozen_fraction=0.5, sharpness=5.0),
            [
                ReasonCode.CONTENT_BLUR,
                ReasonCode.CONTENT_FROZEN,
            ],
        ),
    ],
)
def test_reject_mode_rejects_each_listed_class_with_its_reason_code(
    listed: set[str], worst: ClipQuality, codes: list[ReasonCode]
) -> None:
    rules = RuleSet(reject_content=frozenset(ContentClass(c) for c in listed))
    verdict, reasons, _ = evaluate(decoded(), GOOD_KEYFRAMES, rules, content=content(worst))
    assert [r.code for r in reasons] == codes
    assert verdict is (Verdict.REJECT if codes else Verdict.ACCEPT)
    assert all(r.message for r in reasons)


def test_the_setting_is_a_comma_list_of_classes_and_refuses_duplicate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EGOLINE_CURATION_REJECT", "covered, Frozen")
    monkeypatch.setenv("EGOLINE_CURATION_MAX_FROZEN_FRACTION", "0.35")
    monkeypatch.setenv("EGOLINE_CURATION_DARK_LUMA", "30")
    monkeypatch.setenv("EGOLINE_CLIP_TARGET_S", "6")
    settings = Settings(_env_file=None)
    rules = rules_from(settings)
    assert rules.reject_content == {ContentClass.COVERED, ContentClass.FROZEN}
    assert rules.content_thresholds.max_frozen_fraction == 0.35
    assert (rules.clip_target_s, rules.dark_luma) == (6.0, 30.0)  # the clips the shard cuts
    assert settings.clip_target_s == 6.0
    monkeypatch.setenv("EGOLINE_CURATION_REJECT", "")
    assert rules_from(Settings(_env_file=None)).reject_content == frozenset()
    monkeypatch.delenv("EGOLINE_CURATION_REJECT")
    assert Settings(_env_file=None).curation.reject == frozenset()
    for wrong, says in [("duplicate", "--exclude-duplicates"), ("covered,bogus", "bogus")]:
        monkeypatch.setenv("EGOLINE_CURATION_REJECT", wrong)
        with pytest.raises(ValidationError, match=says):
            Settings(_env_file=None)


def signals(covered: range, still: list[tuple[float, float]]) -> EpisodeSignals:
    """One sample a second over 60 s; `covered` seconds dark and flat; `still` spans."""
    n = 60
    dark = [i in covered for i in range(n)]
    return EpisodeSignals(
        sample_s=1.0,
        streams=[
            StreamSignals(
                camera="main",
                stream_index=0,
                t_s=[float(i) for i in range(n)],
                sharpness=[5.0 if d else 900.0 for d in dark],
                mean_luma=[6.0 if d else 120.0 for d in dark],
                std_luma=[0.8 if d else 40.0 for d in dark],
                highlights=[0.0] * n,
                shadows=[0.9 if d else 0.01 for d in dark],
                phash=["0" * 16] * n,
                still_spans_s=still,
            )
        ],
    )


def imu(gyro_rad_s: float) -> ImuSamples:
    t = np.arange(0.0, 60.0, 0.005)
    values = np.zeros((len(t), 6))
    values[:, 2] = 9.81
    values[:, 3] = gyro_rad_s
    return ImuSamples(t=t, values=values, source_format="npy_timestamped")


def test_validate_judges_the_clips_the_shard_stage_will_cut() -> None:
    # 60 s, a keyframe a second, 10 s clips: six windows; seconds 20-29 covered, a 7 s freeze
    qualities = clip_qualities(
        decoded(), signals(range(20, 30), [(41.0, 48.0)]), imu(0.3), 10.0, 24.0, 2.0
    )
    assert len(qualities) == 6
    assert [q.blocked_fraction for q in qualities] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert [q.frozen_fraction for q in qualities] == [0.0, 0.0, 0.0, 0.0, 0.7, 0.0]
    assert all(q.motion == pytest.approx(0.3) for q in qualities)
    moving = episode_content(
        decoded(), signals(range(0), [(41.0, 48.0)]), imu(0.3), 10.0, 24.0, 2.0
    )
    assert moving is not None
    assert content_classes(moving, ContentThresholds()) == {ContentClass.FROZEN}
    resting = episode_content(
        decoded(), signals(range(0), [(41.0, 48.0)]), imu(0.001), 10.0, 24.0, 2.0
    )
    assert resting is not None
    assert content_classes(resting, ContentThresholds()) == {ContentClass.STATIC}
