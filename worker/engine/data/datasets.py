"""Datasets: built-in digits and its bias variants, clustered noise, and uploaded files.

Every image set is read in [0,1] RGB pixel space (N, 3, H, W); each model's own preprocessing
(resize, mean/std) is applied on the way in, batch by batch, so IRIs and markers are in pixel
units. Uploaded files are memory-mapped (data/pixels.py): a job's memory does not grow with
the file's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from stitchsim.datasets import BUILTIN
from stitchsim.failure import Failure
from stitchsim.files.dataset import DatasetFileInfo, check_dataset, read_labels
from stitchsim.files.digest import object_id
from stitchsim.files.errors import SafetensorsError
from stitchsim.files.header import read_header
from stitchsim.models import BUILTIN_DATASETS, LocalPath, TrainSettings
from stitchsim_worker.engine.core.resources import Resources
from stitchsim_worker.engine.data.pixels import Pixels
from stitchsim_worker.engine.data.shapes import make_shapes

DIGITS_SIZE = 32
SHAPES_SAMPLES = 2000
# Bumped when a built-in generator changes, so cached IRIs of the old data are not reused.
GENERATOR_VERSION = "1"
_SPLIT_SEED = 0
_TEST_FRACTION = 0.2

# Ten well-separated colours (RGB in [0,1]) for class-coloured variants.
CLASS_COLOURS = torch.tensor(
    [
        [0.90, 0.10, 0.10], [0.10, 0.80, 0.10], [0.15, 0.25, 0.95], [0.95, 0.85, 0.10],
        [0.85, 0.15, 0.85], [0.10, 0.85, 0.85], [0.95, 0.55, 0.10], [0.55, 0.30, 0.10],
        [0.60, 0.60, 0.60], [0.55, 0.95, 0.55],
    ]
)  # fmt: skip

DESCRIPTIONS = {name: d.description for name, d in BUILTIN.items()}


NO_LABEL = -1
"""The label of every sample of an unlabelled dataset (such a dataset runs only where no
figure reads labels: job/prepare.py check_labels)."""


@dataclass
class ImageSet:
    pixels: Pixels  # read as float32 (N, 3, H, W) in [0, 1], batch by batch
    labels: torch.Tensor  # int64 (N,); NO_LABEL throughout when unlabelled

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def images(self) -> torch.Tensor:
        """Every image as one float tensor: free for a built-in set (its own tensor), a full
        copy for a file; the job reads `pixels` batch by batch instead."""
        return self.pixels.all()

    def subset(self, n: int | None) -> ImageSet:
        if n is None or n >= len(self):
            return self
        return ImageSet(self.pixels.head(n), self.labels[:n])


@dataclass
class Dataset:
    name: str
    digest: str  # content identity: keys IRI caches
    train: ImageSet
    test: ImageSet
    n_classes: int
    labelled: bool = True
    file: DatasetFileInfo | None = None
    """What an uploaded file's metadata says of it (how its test split was made ...)."""

    @property
    def image_size(self) -> int:
        return int(self.train.pixels.shape[-1])

    @property
    def shorter_side(self) -> int:
        """Of its images, in pixels: what picks the resolution preset of the step sizes."""
        return int(min(self.train.pixels.shape[-2:]))

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.name,
            "n_train": len(self.train),
            "n_test": len(self.test),
            "n_classes": self.n_classes,
            "image_shape": list(self.train.pixels.shape),
            "description": DESCRIPTIONS.get(self.name, "uploaded dataset"),
            "labelled": self.labelled,
        }
        if self.file is not None:
            out["stored_shape"] = list(self.file.image_shape)
            out["stored_dtype"] = self.file.image_dtype.lower().replace("u8", "uint8")
            if self.file.test_split is not None:
                out["test_split"] = self.file.test_split.describe()
            if self.file.source_format is not None:
                out["source_format"] = self.file.source_format
            if self.file.notes:
                out["packing_notes"] = list(self.file.notes)
        return out


# ---------------------------------------------------------------- built-ins


def _digits_grey() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(DIGITS_SIZE, DIGITS_SIZE), mode="bilinear", align_corners=False)
    return x.clamp(0, 1), torch.tensor(d.target, dtype=torch.int64)


def _split(n: int, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified, fixed split: every class keeps the same share in train and test."""
    g = torch.Generator().manual_seed(_SPLIT_SEED)
    train, test = [], []
    for c in labels.unique():
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        k = round(len(idx) * _TEST_FRACTION)
        test.append(idx[:k])
        train.append(idx[k:])
    # Interleave classes so that any prefix (max_*_samples) stays balanced.
    tr, te = torch.cat(train), torch.cat(test)
    return tr[torch.randperm(len(tr), generator=g)], te[torch.randperm(len(te), generator=g)]


def _colourise(grey: torch.Tensor, colours: torch.Tensor) -> torch.Tensor:
    return grey.expand(-1, 3, -1, -1) * colours.view(-1, 3, 1, 1)


def add_marker(images: torch.Tensor, classes: torch.Tensor, side: int = 4) -> torch.Tensor:
    """A class-coloured side x side square in the top-left corner."""
    out = images.clone()
    out[:, :, :side, :side] = CLASS_COLOURS[classes % len(CLASS_COLOURS)].view(-1, 3, 1, 1)
    return out


def clustered_noise(
    labels: torch.Tensor, shape: tuple[int, ...], sigma: float, centres_seed: int, noise_seed: int
) -> torch.Tensor:
    """clamp(c_y + sigma * N(0, I), 0, 1), one uniform centre c_k per class."""
    n_classes = int(labels.max()) + 1
    gc = torch.Generator().manual_seed(centres_seed)
    centres = torch.rand((n_classes, *shape), generator=gc)
    gn = torch.Generator().manual_seed(noise_seed)
    noise = torch.randn((len(labels), *shape), generator=gn)
    return (centres[labels] + sigma * noise).clamp(0, 1)


def _variant(name: str, grey: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    n = len(labels)
    if name == "digits":
        return grey.expand(-1, 3, -1, -1).clone()
    if name == "digits_correlated":
        return _colourise(grey, CLASS_COLOURS[labels])
    if name == "digits_digit_only":
        return _colourise(grey, CLASS_COLOURS[torch.randint(0, 10, (n,), generator=g)])
    if name == "digits_colour_only":
        shapes = grey[torch.randperm(n, generator=g)]
        return _colourise(shapes, CLASS_COLOURS[labels])
    if name == "digits_colour_patches":
        base = torch.rand((n, 3, DIGITS_SIZE, DIGITS_SIZE), generator=g) * 0.3
        lo, hi = DIGITS_SIZE // 4, 3 * DIGITS_SIZE // 4
        base[:, :, lo:hi, lo:hi] = CLASS_COLOURS[labels].view(-1, 3, 1, 1)
        return base
    if name == "digits_marker":
        return add_marker(grey.expand(-1, 3, -1, -1), labels)
    if name == "clustered_noise":
        return clustered_noise(labels, (3, DIGITS_SIZE, DIGITS_SIZE), 0.1, 1, 2)
    raise Failure("invalid_spec", f"unknown built-in dataset {name!r}")


def builtin(name: str) -> Dataset:
    if name not in BUILTIN_DATASETS:
        raise Failure(
            "unknown_dataset",
            f"unknown dataset {name!r}; built-ins are {', '.join(BUILTIN_DATASETS)}, or upload "
            "one with POST /datasets",
        )
    if name == "shapes":
        images, labels = make_shapes(SHAPES_SAMPLES, seed=0)
    else:
        grey, labels = _digits_grey()
        images = _variant(name, grey, labels)
    tr, te = _split(len(labels), labels)
    return Dataset(
        name=name,
        digest=f"builtin:{name}:v{GENERATOR_VERSION}",
        train=ImageSet(Pixels(images[tr].contiguous()), labels[tr]),
        test=ImageSet(Pixels(images[te].contiguous()), labels[te]),
        n_classes=10,
    )


# ---------------------------------------------------------------- uploaded files


def load_file(path: Path, dataset_id: str) -> Dataset:
    """An uploaded (or, in `stitchsim-server run`, local) dataset file, checked by the one
    dataset validator of the contract, then memory-mapped: nothing of the images is read
    here."""
    try:
        header = read_header(path)
        info = check_dataset(path, header)
        sets = {}
        for split in ("train", "test"):
            images = header.tensors[f"{split}_images"]
            if info.labelled:
                labels = torch.tensor(read_labels(path, header.tensors[f"{split}_labels"]),
                                      dtype=torch.int64)
            else:
                labels = torch.full((images.shape[0],), NO_LABEL, dtype=torch.int64)
            sets[split] = ImageSet(Pixels.mapped(path, images), labels)
    except SafetensorsError as e:
        raise Failure("invalid_dataset", f"dataset file: {e.message}", e.details) from None
    except (OSError, ValueError) as e:
        raise Failure("invalid_dataset", f"dataset is not a readable safetensors file: {e}") from e
    return Dataset(
        name=dataset_id or path.name,
        digest=dataset_id or object_id(path),
        train=sets["train"],
        test=sets["test"],
        n_classes=info.n_classes or 0,
        labelled=info.labelled,
        file=info,
    )


def load_dataset(ref: str | LocalPath, resources: Resources, train: TrainSettings) -> Dataset:
    if isinstance(ref, str) and not ref.startswith("sha256:"):
        ds = builtin(ref)
    else:
        path, dataset_id = resources.dataset(ref)
        ds = load_file(path, dataset_id)
    limited = Dataset(
        name=ds.name,
        digest=f"{ds.digest}|train{train.max_train_samples}|test{train.max_test_samples}",
        train=ds.train.subset(train.max_train_samples),
        test=ds.test.subset(train.max_test_samples),
        n_classes=ds.n_classes,
        labelled=ds.labelled,
        file=ds.file,
    )
    # Float pixels are checked where they are read: only the samples this job uses.
    for split, images in (("train", limited.train.pixels), ("test", limited.test.pixels)):
        problem = images.float_problem()
        if problem is not None:
            raise Failure("invalid_dataset", f"float {split}_images {problem}")
    return limited


def save_dataset_file(path: Path, ds: Dataset) -> None:
    """The upload format (uint8 images, int64 labels), e.g. to turn a built-in into a file."""
    from safetensors.torch import save_file

    def u8(x: torch.Tensor) -> torch.Tensor:
        return (x * 255).round().clamp(0, 255).to(torch.uint8).contiguous()

    save_file(
        {
            "train_images": u8(ds.train.images),
            "train_labels": ds.train.labels.contiguous(),
            "test_images": u8(ds.test.images),
            "test_labels": ds.test.labels.contiguous(),
        },
        str(path),
    )
