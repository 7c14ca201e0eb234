"""Pure generators of synthetic episode content: moving RGB scenes, depth maps and IMU rows."""

from __future__ import annotations

from collections.abc import Iterator

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


def imu_rows(count: int, fps: int, seed: int) -> NDArray[np.float32]:
    """(count, 6) float32, one row per frame: accelerometer xyz (m/s^2), gyroscope xyz (rad/s)."""
    rng = np.random.default_rng(seed + 2)
    t = np.arange(count, dtype=np.float64) / fps
    accel = np.stack(
        [0.3 * np.sin(1.1 * t), 0.2 * np.cos(0.7 * t), 9.81 + 0.1 * np.sin(2.3 * t)], axis=1
    )
    gyro = np.stack(
        [0.05 * np.sin(0.9 * t), 0.04 * np.cos(1.3 * t), 0.02 * np.sin(0.4 * t)], axis=1
    )
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
