"""Pure generators of synthetic episode content: moving RGB scenes, depth maps and IMU rows."""

from __future__ import annotations

from collections.abc import Iterator

import cv2
import numpy as np
from numpy.typing import NDArray


def rgb_frames(count: int, width: int, height: int, seed: int) -> Iterator[NDArray[np.uint8]]:
    """A scrolling gradient with a square moving on a Lissajous path: every frame differs,
    so encoders produce realistic P-frames and a decoded frame can be told from its neighbours."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, size=2)
    tint = rng.integers(0, 256, size=3, dtype=np.uint8)
    ys, xs = np.mgrid[0:height, 0:width]
    side = max(8, min(width, height) // 6)
    for t in range(count):
        frame = np.empty((height, width, 3), dtype=np.uint8)
        frame[..., 0] = (xs + 3 * t) % 256
        frame[..., 1] = (ys + 2 * t) % 256
        frame[..., 2] = tint[2]
        cx = int((width - side) * (0.5 + 0.5 * np.sin(0.05 * t + phase[0])))
        cy = int((height - side) * (0.5 + 0.5 * np.sin(0.07 * t + phase[1])))
        frame[cy : cy + side, cx : cx + side] = tint
        yield frame


def depth_frames(count: int, width: int, height: int, seed: int) -> Iterator[NDArray[np.uint8]]:
    """A grey radial depth map whose centre drifts; encoded as a second video stream."""
    rng = np.random.default_rng(seed + 1)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    origin = rng.uniform(0.3, 0.7, size=2)
    for t in range(count):
        cx = width * (origin[0] + 0.2 * np.sin(0.03 * t))
        cy = height * (origin[1] + 0.2 * np.cos(0.03 * t))
        dist = np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2)
        grey = (255 - np.clip(dist, 0, 255)).astype(np.uint8)
        yield np.repeat(grey[..., None], 3, axis=2)


def hand_held_gyro(t: NDArray[np.float64], seed: int) -> NDArray[np.float64]:
    """(N, 3) angular rates (rad/s) of a head-mounted or hand-held device at sorted times t (s):
    a slow sway (a few sines per axis, frequencies and phases drawn from `seed`) plus head
    turns, Gaussian bursts of 0.3-1.5 rad/s lasting 0.1-0.3 s (sigma) about a random axis, on
    average one every 0.8 s. Each seed is its own recording: two seeds never move alike, which
    is what the IMU signature relies on (services/sensors/imu_signature.py)."""
    rng = np.random.default_rng(seed + 97)
    gyro = np.zeros((t.size, 3))
    for axis in range(3):
        for _ in range(3):
            freq = rng.uniform(0.1, 0.8)  # Hz
            gyro[:, axis] += rng.uniform(0.01, 0.05) * np.sin(
                2 * np.pi * freq * t + rng.uniform(0, 2 * np.pi)
            )
    if t.size:
        start, end = float(t.min()) - 1.0, float(t.max()) + 1.0
        turns = rng.poisson(max(1.0, (end - start) / 0.8))
        for centre in rng.uniform(start, end, turns):
            direction = rng.normal(0, 1, 3)
            direction /= float(np.linalg.norm(direction)) or 1.0
            peak = rng.uniform(0.3, 1.5) * rng.choice([-1.0, 1.0])
            width = rng.uniform(0.1, 0.3)
            lo, hi = np.searchsorted(t, [centre - 4 * width, centre + 4 * width])
            burst = peak * np.exp(-0.5 * ((t[lo:hi] - centre) / width) ** 2)
            gyro[lo:hi] += np.outer(burst, direction)
    return gyro


def imu_rows(count: int, fps: int, seed: int) -> NDArray[np.float32]:
    """(count, 6) float32, one row per frame: accelerometer xyz (m/s^2), gyroscope xyz (rad/s)."""
    rng = np.random.default_rng(seed + 2)
    t = np.arange(count, dtype=np.float64) / fps
    accel = np.stack(
        [0.3 * np.sin(1.1 * t), 0.2 * np.cos(0.7 * t), 9.81 + 0.1 * np.sin(2.3 * t)], axis=1
    )
    gyro = hand_held_gyro(t, seed)
    noise = rng.normal(0, 0.01, size=(count, 6))
    return (np.concatenate([accel, gyro], axis=1) + noise).astype(np.float32)


def yuv_scroll_frames(
    count: int, width: int, height: int, seed: int
) -> Iterator[NDArray[np.uint8]]:
    """Fast moving scene, straight in planar YUV 4:2:0: a textured canvas scrolled by a few
    pixels a frame plus a moving block. About 1 ms a 720p frame (vs ~30 ms for `rgb_frames`
    plus conversion), for long high-resolution benchmark episodes."""
    rng = np.random.default_rng(seed)
    pad = 256
    ys, xs = np.mgrid[0 : height + pad, 0 : width + pad]
    phase = rng.uniform(0, 6.28)
    luma = 128 + 60 * np.sin(xs / 23.0 + phase) * np.cos(ys / 31.0) + rng.normal(0, 3, xs.shape)
    canvas_y = np.clip(luma, 16, 235).astype(np.uint8)
    canvas_u = np.full(((height + pad) // 2, (width + pad) // 2), rng.integers(90, 160), np.uint8)
    canvas_v = np.full_like(canvas_u, rng.integers(90, 160))
    side = max(16, min(width, height) // 6) // 2 * 2
    out = np.empty((height * 3 // 2, width), dtype=np.uint8)
    for t in range(count):
        dx, dy = (3 * t) % pad // 2 * 2, (2 * t) % pad // 2 * 2
        out[:height] = canvas_y[dy : dy + height, dx : dx + width]
        u = canvas_u[dy // 2 : dy // 2 + height // 2, dx // 2 : dx // 2 + width // 2]
        v = canvas_v[dy // 2 : dy // 2 + height // 2, dx // 2 : dx // 2 + width // 2]
        out[height : height + height // 4] = u.reshape(height // 4, width)
        out[height + height // 4 :] = v.reshape(height // 4, width)
        cx = int((width - side) * (0.5 + 0.5 * np.sin(0.05 * t))) // 2 * 2
        cy = int((height - side) * (0.5 + 0.5 * np.cos(0.07 * t))) // 2 * 2
        out[cy : cy + side, cx : cx + side] = 235
        yield out.copy()


def textured_canvas(width: int, height: int, seed: int) -> NDArray[np.uint8]:
    """A detailed still scene (HxWx3 RGB): a soft colour field under many hard-edged shapes,
    lines and printed text, the kind of edges a sharp lens resolves and blur removes. The edges
    survive default-CRF encoding (fine noise would not), so sharpness stays measurable after
    decode: the variance of the Laplacian of a frame is in the thousands, of a blurred one tens."""
    rng = np.random.default_rng(seed + 21)
    coarse = rng.integers(50, 206, size=(height // 40 + 2, width // 40 + 2, 3)).astype(np.uint8)
    canvas = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    area = width * height
    for _ in range(area // 900):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        w, h = int(rng.integers(4, 40)), int(rng.integers(4, 40))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        filled = -1 if rng.random() < 0.6 else int(rng.integers(1, 3))
        cv2.rectangle(canvas, (x, y), (x + w, y + h), colour, filled)
    for _ in range(area // 2500):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(-60, 60)), y0 + int(rng.integers(-60, 60))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        cv2.line(canvas, (x0, y0), (x1, y1), colour, int(rng.integers(1, 3)))
    letters = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"
    for _ in range(area // 4000):
        text = "".join(letters[int(i)] for i in rng.integers(0, len(letters), 5))
        x, y = int(rng.integers(0, width - 40)), int(rng.integers(12, height))
        shade = 0 if rng.random() < 0.5 else 255
        cv2.putText(canvas, text, (x, y), cv2.FONT_HERSHEY_PLAIN, 1.0, (shade,) * 3, 1)
    return np.ascontiguousarray(canvas)


def panning_frames(count: int, width: int, height: int, seed: int) -> Iterator[NDArray[np.uint8]]:
    """A hand-held camera slowly panning over `textured_canvas` with an object (a square)
    crossing on a Lissajous path: every frame differs and every frame is detailed."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, size=4)
    tint = rng.integers(0, 256, size=3, dtype=np.uint8)
    pad = 128
    canvas = textured_canvas(width + pad, height + pad, seed)
    side = max(8, min(width, height) // 6)
    for t in range(count):
        dx = int((pad - 1) * (0.5 + 0.5 * np.sin(0.031 * t + phase[2])))
        dy = int((pad - 1) * (0.5 + 0.5 * np.sin(0.023 * t + phase[3])))
        frame = canvas[dy : dy + height, dx : dx + width].copy()
        cx = int((width - side) * (0.5 + 0.5 * np.sin(0.05 * t + phase[0])))
        cy = int((height - side) * (0.5 + 0.5 * np.sin(0.07 * t + phase[1])))
        frame[cy : cy + side, cx : cx + side] = tint
        yield frame
