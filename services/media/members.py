"""Member names of a clip (pure): which label each video stream of an episode's files gets."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol


class _Titled(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def title(self) -> str | None: ...


class LabelledSource(Protocol):
    """A camera's file: its name and its video streams (main camera first)."""

    @property
    def camera(self) -> str: ...
    @property
    def streams(self) -> Sequence[_Titled]: ...


def member_labels(sources: Sequence[LabelledSource]) -> dict[tuple[str, int], str]:
    """A member label per (camera, stream index), unique within the episode and dot-free (a
    WebDataset key ends at the first dot): a camera's first stream takes the camera's name (the
    main camera's is the clip's own `<key>.mp4`); the main camera's other streams take their
    title (`depth`) or `s<index>`, another camera's `<camera>-<title or s<index>>`."""
    labels: dict[tuple[str, int], str] = {}
    used: set[str] = set()
    for n, src in enumerate(sources):
        for k, stream in enumerate(src.streams):
            own = _slug(stream.title) or f"s{stream.index}"
            label = src.camera if k == 0 else own if n == 0 else f"{src.camera}-{own}"
            base, i = label, 1
            while label in used:
                i += 1
                label = f"{base}{i}"
            used.add(label)
            labels[(src.camera, stream.index)] = label
    return labels


def _slug(title: str | None) -> str:
    if not title:
        return ""
    return re.sub(r"[^a-z0-9_-]+", "-", title.lower()).strip("-")[:32]
