"""The built-in datasets: one catalogue that the gateway lists (GET /datasets), the spec
validates against and the engine describes its data with. The engine generates them (no
download); the figures here are what it generates: scikit-learn's 1797 digits (or 2000
synthetic shapes) in a fixed, stratified 80/20 split, as 3 x 32 x 32 images in [0, 1],
10 classes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuiltinDataset:
    name: str
    description: str
    n_train: int = 1438
    n_test: int = 359
    image_shape: tuple[int, int, int] = (3, 32, 32)
    n_classes: int = 10


BUILTIN: dict[str, BuiltinDataset] = {
    d.name: d
    for d in (
        BuiltinDataset("digits", "scikit-learn's 8x8 digits, upscaled to 32x32, grey in RGB"),
        BuiltinDataset("digits_correlated",
                       "digits drawn in their class colour: shape and colour both predict"),
        BuiltinDataset("digits_digit_only",
                       "digits in a random colour: only the shape predicts the class"),
        BuiltinDataset("digits_colour_only",
                       "a random digit drawn in the label's colour: only the colour predicts"),
        BuiltinDataset("digits_colour_patches",
                       "no digit: a patch in the label's colour on dim noise"),
        BuiltinDataset("digits_marker", "grey digits with a class-coloured 4x4 marker in the "
                       "top-left corner (a pixel shortcut)"),
        BuiltinDataset("clustered_noise",
                       "one uniform-noise centre per class plus Gaussian noise (sigma 0.1)"),
        BuiltinDataset("shapes", "ten geometric shapes (disc, ring, square, frame, triangle, "
                       "plus, cross, bars, checkerboard) in random colours, places and sizes: "
                       "a second task that shares nothing with digits", n_train=1600,
                       n_test=400),
    )
}

BUILTIN_DATASETS: tuple[str, ...] = tuple(BUILTIN)
