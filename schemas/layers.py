"""Layer rows: data attached to episodes after ingestion, one pydantic model per layer kind.

A layer file (JSON Lines or Parquet) holds rows of one kind; the `episodes.annotated` event
carries the same rows. Units: pixels for intrinsics, metres for translations, seconds on the
episode clock (from the episode's first frame, as `clip_start_s`) for time spans. The layouts
are documented in docs/formats.md ("Layer files").
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
LayerEpisodeId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
LayerDeviceId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
LayerCameraName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")]
# A layer version's name: free, but never `latest` (what a manifest resolves at build time).
LATEST = "latest"


def _not_latest(name: str) -> str:
    if name == LATEST:
        raise ValueError("`latest` is not a version name: a manifest resolves it at build time")
    return name


LayerVersionName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"),
    AfterValidator(_not_latest),
]


class LayerKind(StrEnum):
    """What a layer holds. Curation signals are not a layer kind: they are derived from the
    video by the pipeline and versioned by its `pipeline_version` (docs/warehouse.md)."""

    CALIBRATION = "calibration"
    LABELS = "labels"


class DistortionModel(StrEnum):
    """Lens distortion models and their coefficient counts (OpenCV's conventions)."""

    NONE = "none"  # no coefficients
    OPENCV = "opencv"  # k1 k2 p1 p2 [k3 [k4 k5 k6 [s1 s2 s3 s4 [tx ty]]]]: 4, 5, 8, 12 or 14
    FISHEYE = "fisheye"  # Kannala-Brandt equidistant (cv2.fisheye): k1 k2 k3 k4


DISTORTION_COEFFICIENTS: dict[DistortionModel, tuple[int, ...]] = {
    DistortionModel.NONE: (0,),
    DistortionModel.OPENCV: (4, 5, 8, 12, 14),
    DistortionModel.FISHEYE: (4,),
}


Finite = Annotated[float, Field(allow_inf_nan=False)]
ORTHONORMAL_TOLERANCE = 1e-4  # |R Rᵀ - I| per entry: float32-rounded rotations pass


class Row(BaseModel):
    # Events ignore unknown fields (schemas/events.py); a layer *file* refuses them at their
    # line (services/metadata/layers.py), so a misspelt key is not a value silently dropped.
    model_config = ConfigDict(frozen=True, extra="ignore")


class CalibrationRow(Row):
    """One camera's calibration, for one episode or for a device over a validity window.

    Exactly one of `episode_id` / `device_id`. A device row applies to the device's episodes
    that started in [valid_from, valid_until) (open ends: None); an episode row wins over a
    device row for the same camera.
    """

    episode_id: LayerEpisodeId | None = None
    device_id: LayerDeviceId | None = None
    valid_from: AwareDatetime | None = Field(default=None, description="device rows: inclusive")
    valid_until: AwareDatetime | None = Field(default=None, description="device rows: exclusive")
    camera: LayerCameraName = Field(description="camera name, as the episode's `camera`")
    width: int = Field(gt=0, le=65536, description="image width the intrinsics refer to, px")
    height: int = Field(gt=0, le=65536, description="image height, px")
    fx: Finite = Field(gt=0, description="focal length, px")
    fy: Finite = Field(gt=0, description="focal length, px")
    cx: Finite = Field(description="principal point, px from the left edge")
    cy: Finite = Field(description="principal point, px from the top edge")
    distortion_model: DistortionModel = DistortionModel.NONE
    distortion: list[Finite] = Field(default_factory=list, max_length=14)
    extrinsics: list[Finite] = Field(
        min_length=16,
        max_length=16,
        description="4x4 camera-to-rig transform, row-major; translation in metres",
    )

    @model_validator(mode="after")
    def _consistent(self) -> CalibrationRow:
        # Plain arithmetic, no loops over generators: a 10^5-row layer is checked row by row.
        if (self.episode_id is None) == (self.device_id is None):
            raise ValueError("give exactly one of episode_id and device_id")
        if self.episode_id is not None and (
            self.valid_from is not None or self.valid_until is not None
        ):
            raise ValueError("valid_from / valid_until are for device rows")
        if (
            self.valid_from is not None
            and self.valid_until is not None
            and self.valid_from >= self.valid_until
        ):
            raise ValueError("valid_from must be before valid_until")
        allowed = DISTORTION_COEFFICIENTS[self.distortion_model]
        if len(self.distortion) not in allowed:
            raise ValueError(
                f"{self.distortion_model.value} distortion takes {' or '.join(map(str, allowed))}"
                f" coefficients, got {len(self.distortion)}"
            )
        a, b, c, _, d, e, f, _, g, h, i, _, *last = self.extrinsics
        if last != [0.0, 0.0, 0.0, 1.0]:
            raise ValueError("extrinsics: the last row of the 4x4 must be 0 0 0 1")
        products = (
            a * a + b * b + c * c - 1.0,
            d * d + e * e + f * f - 1.0,
            g * g + h * h + i * i - 1.0,
            a * d + b * e + c * f,
            a * g + b * h + c * i,
            d * g + e * h + f * i,
        )
        if max(products) > ORTHONORMAL_TOLERANCE or min(products) < -ORTHONORMAL_TOLERANCE:
            raise ValueError("extrinsics: the 3x3 rotation is not orthonormal")
        return self

    def target(self) -> tuple[str | None, str | None, str, datetime | None]:
        """What the row is keyed on within a version: episode or device, camera, window."""
        return (self.episode_id, self.device_id, self.camera, self.valid_from)


class LabelType(StrEnum):
    LABEL = "label"  # a time-span label (an action, an event)
    SUBTASK = "subtask"  # a subtask: its span is its boundaries
    INSTRUCTION = "instruction"  # a language instruction for the span (the task)
    CAPTION = "caption"  # a free-text caption


class LabelRow(Row):
    """A labelled time span of an episode, seconds on the episode clock (from its first
    frame, the clock of the manifest's `clip_start_s`)."""

    episode_id: LayerEpisodeId
    label_type: LabelType = LabelType.LABEL
    start_s: Finite = Field(ge=0)
    end_s: Finite = Field(ge=0)
    text: str = Field(min_length=1, max_length=2000)

    @model_validator(mode="after")
    def _ordered(self) -> LabelRow:
        if self.end_s < self.start_s:
            raise ValueError("end_s must not be before start_s")
        if "\x00" in self.text:  # Postgres text holds no NUL: refuse it here, at its line
            raise ValueError("text must not contain NUL characters")
        return self


LAYER_ROW_MODELS: dict[LayerKind, type[Row]] = {
    LayerKind.CALIBRATION: CalibrationRow,
    LayerKind.LABELS: LabelRow,
}


class CalibrationLayer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: Literal[LayerKind.CALIBRATION] = LayerKind.CALIBRATION
    rows: list[CalibrationRow] = Field(min_length=1)


class LabelsLayer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: Literal[LayerKind.LABELS] = LayerKind.LABELS
    rows: list[LabelRow] = Field(min_length=1)
