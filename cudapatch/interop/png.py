"""Minimal PNG writing and reading (RGBA8, no dependencies beyond zlib) for headless previews."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["write_png", "read_png"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png(path: str | Path, rgba: np.ndarray, *, level: int = 3) -> Path:
    """Write an ``(height, width, 4)`` uint8 image (top row first) as a PNG file."""
    img = np.ascontiguousarray(rgba, dtype=np.uint8)
    if img.ndim != 3 or img.shape[2] != 4:
        raise ValueError(f"write_png wants (height, width, 4) uint8, got shape {img.shape}")
    h, w, _ = img.shape
    raw = np.zeros((h, w * 4 + 1), np.uint8)  # filter byte 0 (None) in front of each row
    raw[:, 1:] = img.reshape(h, w * 4)
    body = _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
    body += _chunk(b"IDAT", zlib.compress(raw.tobytes(), level)) + _chunk(b"IEND", b"")
    path = Path(path)
    path.write_bytes(_SIGNATURE + body)
    return path


def read_png(path: str | Path) -> np.ndarray:
    """Read an RGBA8 PNG written by ``write_png`` (filter type 0 rows) as ``(height, width, 4)``."""
    data = Path(path).read_bytes()
    if not data.startswith(_SIGNATURE):
        raise ValueError(f"{path}: not a PNG file")
    pos, idat, w = len(_SIGNATURE), b"", 0
    h = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, payload = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", payload[:10])
            if (depth, color) != (8, 6):
                raise ValueError(f"{path}: only RGBA8 PNGs are supported")
        elif kind == b"IDAT":
            idat += payload
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, w * 4 + 1)
    if raw[:, 0].any():
        raise ValueError(f"{path}: PNG row filters are not supported by this reader")
    return raw[:, 1:].reshape(h, w, 4).copy()
