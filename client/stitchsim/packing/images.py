"""Image bytes and arrays to what the service stores: uint8, C x H x W, one size for all.

Decoding is Pillow's. An image is probed first (its header only: size and colour mode), so
the size to store is known before any pixel is decoded; it is decoded when it is written.
Colour images (RGB, RGBA, palette, CMYK ...) become RGB, alpha dropped; a dataset whose
images are all grey stays one channel. An image of another size is scaled to cover the
stored size and centre-cropped (Pillow's ImageOps.fit), keeping its aspect ratio.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from stitchsim.packing.records import Record

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".pbm", ".pnm",
                  ".tif", ".tiff", ".webp")
MAX_SOURCE_PIXELS = 64 * 1024 * 1024
"""A source image may have at most this many pixels (Pillow warns from 89 M): bigger ones are
decompression bombs, or not meant for a dataset of small images."""
_GREY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}


class BadImage(ValueError):
    """The record holds no image Pillow can read; the message says why."""


@dataclass(frozen=True)
class Probe:
    height: int
    width: int
    grey: bool


def _open(data: bytes) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        # Pillow's own message names the BytesIO it was given ("<_io.BytesIO object at
        # 0x...>"); the caller names the file.
        raise BadImage("not an image file Pillow can read: its format is not recognised, or "
                       "it is damaged") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadImage(str(exc) or type(exc).__name__) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise BadImage(f"{type(exc).__name__}: {exc}") from None
    w, h = img.size
    if w * h > MAX_SOURCE_PIXELS:
        raise BadImage(f"{w}x{h} pixels, more than the {MAX_SOURCE_PIXELS} accepted")
    return img


def probe(record: Record) -> Probe:
    """Size and greyness, from the header alone (arrays: from their shape)."""
    if isinstance(record.data, np.ndarray):
        a = record.data
        return Probe(int(a.shape[0]), int(a.shape[1]), a.ndim == 2 or a.shape[2] == 1)
    img = _open(record.data)
    w, h = img.size
    return Probe(h, w, img.mode in _GREY_MODES)


def pixels(record: Record, size: tuple[int, int], grey: bool) -> tuple[np.ndarray, bool]:
    """(C x H x W uint8 at `size`, whether it had to be resized)."""
    if isinstance(record.data, np.ndarray):
        a = record.data if record.data.ndim == 3 else record.data[:, :, None]
        if a.shape[:2] == size:  # the common case for arrays: no round trip through Pillow
            if not grey and a.shape[2] == 1:
                a = np.repeat(a, 3, axis=2)
            return np.ascontiguousarray(a.transpose(2, 0, 1)), False
        img = Image.fromarray(a[:, :, 0] if a.shape[2] == 1 else a)
    else:
        img = _open(record.data)
        try:
            img.load()
        except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt pixel data
            raise BadImage(f"{type(exc).__name__}: {exc}") from None
    img = _as_mode(img, grey)
    h, w = size
    resized = img.size != (w, h)
    if resized:
        img = ImageOps.fit(img, (w, h), method=Image.Resampling.BICUBIC)
    a = np.asarray(img, dtype=np.uint8)
    a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return np.ascontiguousarray(a), resized


def _as_mode(img: Image.Image, grey: bool) -> Image.Image:
    if grey:
        if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
            # 16-bit and float grey: scaled to 8 bits by the image's own range.
            a = np.asarray(img, dtype=np.float64)
            top = a.max() if a.max() > 255 else 255.0
            return Image.fromarray(np.clip(a / top * 255.0 + 0.5, 0, 255).astype(np.uint8))
        return img.convert("L")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        return img.convert("RGBA").convert("RGB")
    return img.convert("RGB")
