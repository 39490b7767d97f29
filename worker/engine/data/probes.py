"""Probe sets (spec.probes): datasets a job evaluates its stitches on beside the clean one.

A latent shortcut (a marker, a watermark, a background) acts only where its cue is present,
so a check on clean data cannot see it; a probe is a set of inputs where it would show. A
probe is any dataset the service takes; its test split is what runs, so a built-in probe of
the digits (digits_marker_conflict ...) holds the very digits of the clean test split, only
marked. Everything a probe could get wrong is refused here, naming the probe, before any
work: the spec check runs this at submission, the job again as it prepares.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from stitchsim.failure import Failure
from stitchsim.models import LocalPath, Spec, TrainSettings, probe_name
from stitchsim.probes import BUILTIN_PROBES
from stitchsim_worker.engine.core.resources import Resources
from stitchsim_worker.engine.data.datasets import (
    Dataset,
    ImageSet,
    add_marker,
    builtin,
    load_dataset,
)
from stitchsim_worker.engine.data.pixels import Pixels


@dataclass(frozen=True)
class Probe:
    name: str
    data: Dataset

    @property
    def test(self) -> ImageSet:
        return self.data.test

    @property
    def digest(self) -> str:
        return self.data.digest


def load_probes(spec: Spec, resources: Resources, data: Dataset) -> list[Probe]:
    """Each of the spec's probes, checked against the comparison's dataset."""
    probes = []
    for ref in spec.probes:
        name = probe_name(ref)
        try:
            probe = Probe(name, _load(ref, resources, spec.train))
        except Failure as e:
            raise _naming(name, e) from None
        check_probe(probe, data)
        probes.append(probe)
    return probes


def _load(ref: str | LocalPath, resources: Resources, train: TrainSettings) -> Dataset:
    """A built-in probe, capped as the dataset is (train.max_test_samples), or any dataset."""
    if not (isinstance(ref, str) and ref in BUILTIN_PROBES):
        return load_dataset(ref, resources, train)
    ds = builtin_probe(ref)
    n = train.max_test_samples
    return Dataset(ds.name, f"{ds.digest}|test{n}", ds.train, ds.test.subset(n), ds.n_classes)


def check_probe(probe: Probe, data: Dataset) -> None:
    """What a probe must share with the dataset the models are compared on: a non-empty test
    split, the same image shape (channels and size: the models' preprocessing was chosen on the
    dataset), and no class the models do not have."""
    n = len(probe.test)
    if n == 0:
        raise Failure("invalid_dataset",
                      f"probe {probe.name} has no test images: a probe runs on its test split; "
                      "put the probe's images there", {"probe": probe.name})
    shape, want = tuple(probe.test.pixels.shape), tuple(data.test.pixels.shape)  # per image
    if shape != want:
        raise Failure("invalid_dataset",
                      f"probe {probe.name} has images of shape {list(shape)} (channels, height, "
                      f"width) and dataset {data.name} {list(want)}: a probe must have the "
                      "dataset's image shape, since both models read it with the dataset's "
                      "preprocessing; resize or convert the probe's images",
                      {"probe": probe.name, "shape": list(shape), "expected": list(want)})
    if probe.data.labelled and probe.data.n_classes > data.n_classes:
        raise Failure("class_mismatch",
                      f"probe {probe.name} has {probe.data.n_classes} classes and dataset "
                      f"{data.name} {data.n_classes}: a probe's labels must be the dataset's "
                      "classes", {"probe": probe.name})


def check_probe_labels(probes: list[Probe], needs: list[str]) -> None:
    """An unlabelled probe where the job reads labels (prepare.labels_needed says what does)."""
    for probe in probes:
        if not probe.data.labelled and needs:
            raise Failure(
                "labels_needed",
                f"probe {probe.name} has no labels, and this job needs them for: "
                f"{'; '.join(needs)}; give the probe its labels (the digit or class each "
                "image shows, not its cue's)", {"probe": probe.name, "needed_by": needs})


def _naming(name: str, e: Failure) -> Failure:
    """A dataset's failure, said of the probe it was loaded for."""
    details = e.details if isinstance(e.details, dict) else {"cause": e.details}
    return Failure(e.code, f"probe {name}: {e.message}", {**details, "probe": name},
                   retry_after=e.retry_after)


# ---------------------------------------------------------------- built-ins

BUILTIN_PROBE_VERSION = "1"
"""Bumped when a recipe changes, so kept activations of the old probe are not reused."""


def conflicting_classes(labels: torch.Tensor, n_classes: int, seed: int = 1) -> torch.Tensor:
    """Another class for each label, uniform over the n_classes - 1 others (seeded)."""
    g = torch.Generator().manual_seed(seed)
    shift = torch.randint(1, n_classes, labels.shape, generator=g)
    return (labels + shift) % n_classes


def marker_classes(name: str, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """The class whose marker each image of a built-in probe carries."""
    if name == "digits_marker_conflict":
        return conflicting_classes(labels, n_classes)
    if name == "digits_marker_swapped":
        return (labels + 1) % n_classes
    raise Failure("unknown_dataset", f"unknown built-in probe {name!r}")


def builtin_probe(name: str) -> Dataset:
    """A built-in probe: its base dataset's splits with digits_marker's marker painted in the
    class the recipe names (datasets.add_marker: one marker recipe for the data, the probes and
    the benches); the labels stay the base's."""
    base = builtin(BUILTIN_PROBES[name].base)

    def marked(split: ImageSet) -> ImageSet:
        classes = marker_classes(name, split.labels, base.n_classes)
        return ImageSet(Pixels(add_marker(split.images, classes).contiguous()), split.labels)

    return Dataset(name=name, digest=f"builtin-probe:{name}:v{BUILTIN_PROBE_VERSION}",
                   train=marked(base.train), test=marked(base.test), n_classes=base.n_classes)
