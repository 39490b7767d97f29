"""Image and label arrays from numpy files (npz, safetensors) to the packer's records."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stitchsim.errors import DatasetSourceError


def images_hwc(path: Path, name: str, a: np.ndarray, notes: list[str]) -> np.ndarray:
    """N x H x W x C (C = 1 or 3) uint8 from N x H x W, N x H x W x C or N x C x H x W arrays
    of uint8, other integers in 0..255, or floats in [0, 1] (or 0..255)."""
    if a.ndim == 3:
        a = a[..., None]
    elif a.ndim == 4:
        last, second = a.shape[3] in (1, 3, 4), a.shape[1] in (1, 3)
        if second and not last:
            a = a.transpose(0, 2, 3, 1)
        elif not last:
            raise DatasetSourceError(
                f"{path}: {name} has shape {list(a.shape)}; images are N x H x W, N x H x W x C "
                "or N x C x H x W with C = 1 or 3")
        elif second:
            notes.append(f"{name} {list(a.shape)} read as N x H x W x C (channels last)")
        if a.shape[3] == 4:
            a = a[..., :3]
            notes.append(f"{name}: the fourth channel (alpha) dropped")
    else:
        raise DatasetSourceError(
            f"{path}: {name} has {a.ndim} dimensions ({list(a.shape)}); images are N x H x W, "
            "N x H x W x C or N x C x H x W")
    return _as_uint8(path, name, a, notes)


def _as_uint8(path: Path, name: str, a: np.ndarray, notes: list[str]) -> np.ndarray:
    if a.dtype == np.uint8:
        return a
    if a.dtype == np.bool_:
        return a.astype(np.uint8) * 255
    if np.issubdtype(a.dtype, np.integer):
        low, high = int(a.min()), int(a.max())
        if low < 0 or high > 255:
            raise DatasetSourceError(f"{path}: {name} holds integers {low}..{high}; pixels are "
                                     "0..255 (uint8) or floats in [0, 1]")
        return a.astype(np.uint8)
    if np.issubdtype(a.dtype, np.floating):
        if not np.isfinite(a).all():
            raise DatasetSourceError(f"{path}: {name} holds NaN or infinite values")
        low, high = float(a.min()), float(a.max())
        if low < 0 or high > 255:
            raise DatasetSourceError(f"{path}: {name} holds values {low:g}..{high:g}; pixels "
                                     "are floats in [0, 1] or 0..255")
        scale = 255.0 if high <= 1 else 1.0
        if scale == 1.0:
            notes.append(f"{name}: floats above 1 read as 0..255 pixel values")
        return np.clip(np.rint(a.astype(np.float32) * scale), 0, 255).astype(np.uint8)
    raise DatasetSourceError(f"{path}: {name} has dtype {a.dtype}; pixels are uint8 or float")


def labels_1d(path: Path, name: str, y: np.ndarray, n: int, notes: list[str]) -> list[int]:
    """Class ids from 1-D integers, N x 1, integral floats, or one-hot rows."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    elif y.ndim == 2 and y.shape[1] > 1 and np.isin(y, (0, 1)).all() and (y.sum(1) == 1).all():
        notes.append(f"{name}: one-hot rows read as class ids")
        y = y.argmax(1)
    if y.ndim != 1:
        raise DatasetSourceError(f"{path}: {name} has shape {list(y.shape)}; labels are one "
                                 "integer a sample (or one-hot rows)")
    if len(y) != n:
        raise DatasetSourceError(f"{path}: {name} holds {len(y)} labels for {n} images")
    if np.issubdtype(y.dtype, np.floating):
        if not (np.isfinite(y).all() and (y == np.rint(y)).all()):
            raise DatasetSourceError(f"{path}: {name} holds non-integer labels")
    elif not np.issubdtype(y.dtype, np.integer):
        raise DatasetSourceError(f"{path}: {name} has dtype {y.dtype}; labels are integers")
    return [int(v) for v in y]
