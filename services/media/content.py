"""The content classes of an episode from its clips' signals: one pure decision, used by the
benchmark's scoring (`services.bench.curate.predict`, on the warehouse's clip rows) and by the
validate stage's opt-in reject mode (on the clip windows it computes itself), so the two cannot
drift (docs/curation.md).

An episode is judged by its worst clip, as a manifest filter is ("an episode passes when every
one of its clips does"): the lowest sharpness, the darkest and the brightest mean luma, the most
clipped highlights and crushed shadows, the most frozen and the most covered clip, the least
motion.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schemas.events import ClipQuality, ContentClass
from services.common.settings import CurationSettings


@dataclass(frozen=True)
class ContentThresholds:
    """What counts as each class, on an episode's worst clip (`EGOLINE_CURATION_*`; each means
    what the manifest filter of the same name means). Luma on the 8-bit scale, fractions of
    pixels or of time in [0, 1], motion in rad/s."""

    min_sharpness: float = 100.0
    max_frozen_fraction: float = 0.2
    min_blocked_fraction: float = 0.5
    min_motion: float = 0.01
    max_highlights: float = 0.2
    max_shadows: float = 0.3
    min_mean_luma: float = 30.0
    max_mean_luma: float = 225.0

    @classmethod
    def of(cls, curation: CurationSettings) -> ContentThresholds:
        return cls(
            min_sharpness=curation.min_sharpness,
            max_frozen_fraction=curation.max_frozen_fraction,
            min_blocked_fraction=curation.min_blocked_fraction,
            min_motion=curation.min_motion,
            max_highlights=curation.max_highlights,
            max_shadows=curation.max_shadows,
            min_mean_luma=curation.min_mean_luma,
            max_mean_luma=curation.max_mean_luma,
        )


@dataclass(frozen=True)
class EpisodeContent:
    """An episode's worst clip values (None: no clip had the value, e.g. no IMU, no picture)."""

    sharpness: float | None  # lowest clip median
    min_luma: float | None  # darkest clip's mean luma
    max_luma: float | None  # brightest clip's mean luma
    highlights: float | None  # highest
    shadows: float | None  # highest
    frozen_fraction: float  # highest
    blocked_fraction: float  # highest
    motion: float | None  # lowest clip gyro RMS (None: no IMU)

    @classmethod
    def of_clips(cls, clips: Iterable[ClipQuality]) -> EpisodeContent:
        qualities = list(clips)

        def values(name: str) -> list[float]:
            return [v for q in qualities if (v := getattr(q, name)) is not None]

        luma = values("mean_luma")
        return cls(
            sharpness=min(values("sharpness"), default=None),
            min_luma=min(luma, default=None),
            max_luma=max(luma, default=None),
            highlights=max(values("highlights"), default=None),
            shadows=max(values("shadows"), default=None),
            frozen_fraction=max(values("frozen_fraction"), default=0.0),
            blocked_fraction=max(values("blocked_fraction"), default=0.0),
            motion=min(values("motion"), default=None),
        )


def content_classes(content: EpisodeContent, th: ContentThresholds) -> set[ContentClass]:
    """The classes the values say, most specific first: a covered lens is dark and flat (not
    "underexposed", not "blurred"); a dark or clipped picture has no contrast for the Laplacian,
    so blur is judged on well-exposed pictures only; a picture that stops while the device rests
    is a device at rest, frozen only when the device moves (or has no IMU)."""
    out: set[ContentClass] = set()
    covered = content.blocked_fraction >= th.min_blocked_fraction
    static = content.motion is not None and content.motion < th.min_motion
    over = (content.highlights or 0.0) > th.max_highlights or (
        content.max_luma is not None and content.max_luma > th.max_mean_luma
    )
    under = (content.shadows or 0.0) > th.max_shadows or (
        content.min_luma is not None and content.min_luma < th.min_mean_luma
    )
    if covered:
        out.add(ContentClass.COVERED)
    elif over:
        out.add(ContentClass.OVEREXPOSED)
    elif under:
        out.add(ContentClass.UNDEREXPOSED)
    elif content.sharpness is not None and content.sharpness < th.min_sharpness:
        out.add(ContentClass.BLUR)
    if static:
        out.add(ContentClass.STATIC)
    elif not covered and content.frozen_fraction > th.max_frozen_fraction:
        out.add(ContentClass.FROZEN)
    return out


def describe(cls: ContentClass, content: EpisodeContent, th: ContentThresholds) -> str:
    """Why the values put the episode in `cls` (a reject's message)."""
    match cls:
        case ContentClass.COVERED:
            return (
                f"lens covered over {content.blocked_fraction:.0%} of a clip "
                f"(>= {th.min_blocked_fraction:.0%})"
            )
        case ContentClass.OVEREXPOSED:
            return (
                f"overexposed: highlights {content.highlights}, brightest clip mean luma "
                f"{content.max_luma} (bounds {th.max_highlights}, {th.max_mean_luma})"
            )
        case ContentClass.UNDEREXPOSED:
            return (
                f"underexposed: shadows {content.shadows}, darkest clip mean luma "
                f"{content.min_luma} (bounds {th.max_shadows}, {th.min_mean_luma})"
            )
        case ContentClass.BLUR:
            return f"blurred: a clip's sharpness {content.sharpness} < {th.min_sharpness}"
        case ContentClass.FROZEN:
            return (
                f"picture frozen over {content.frozen_fraction:.0%} of a clip "
                f"(> {th.max_frozen_fraction:.0%}) while the device moves"
            )
        case ContentClass.STATIC:
            return f"device at rest: a clip's gyro RMS {content.motion} < {th.min_motion} rad/s"
