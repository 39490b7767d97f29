"""The catalogue: every name a user can write, with its label, description, plot style,
preference rank and flags. One entry a name; nothing else in the project spells the
vocabulary out.

The contract's `Literal` types (stitchsim.models.vocabulary) are built from these entries, so
the spec validates against them; the view's labels, the page's plot styles, the verdict's
protocol preference, the CLI help and the OpenAPI descriptions are read from them; the engine's
registries attach behaviour to the same names, and a test holds the two 1 : 1. Adding an
objective, a protocol or a measure is its entry here plus its entry in the engine.

Standard library only: the client, the gateway (no torch) and the engine all import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar


@dataclass(frozen=True)
class PlotStyle:
    """How a series is drawn: Okabe & Ito's colour-blind-safe palette, and a line style and
    marker of its own, so plots survive greyscale printing."""

    color: str
    linestyle: str = "-"
    marker: str = "o"

    def as_kwargs(self) -> dict[str, str]:
        return {"color": self.color, "linestyle": self.linestyle, "marker": self.marker}

    def in_words(self) -> str:
        """"blue, solid": how a legend in prose names the series."""
        return f"{COLOR_NAMES.get(self.color, self.color)}, {LINE_NAMES.get(self.linestyle, '')}"


# Okabe & Ito's palette.
BLUE, VERMILLION, GREEN, ORANGE = "#0072B2", "#D55E00", "#009E73", "#E69F00"
PURPLE, SKY, YELLOW, GREY, BLACK = "#CC79A7", "#56B4E9", "#F0E442", "#6E6E6E", "#000000"
COLOR_NAMES = {BLUE: "blue", VERMILLION: "vermillion", GREEN: "green", ORANGE: "orange",
               PURPLE: "purple", SKY: "sky blue", YELLOW: "yellow", GREY: "grey",
               BLACK: "black"}
LINE_NAMES = {"-": "solid", "--": "dashed", "-.": "dash-dotted", ":": "dotted"}


@dataclass(frozen=True)
class BandStyle:
    """How a control is drawn behind the comparison's lines: a translucent band of its colour,
    hatched or outlined, so bands stay apart without colour."""

    color: str
    label: str
    hatch: str | None = None

    def in_words(self) -> str:
        """"grey hatched band": how a legend in prose names the band."""
        return f"{COLOR_NAMES.get(self.color, self.color)}{' hatched' if self.hatch else ''} band"


@dataclass(frozen=True)
class Entry:
    name: str
    label: str
    description: str
    short: str = ""
    """A label for tight places (table headers, plot legends); the label when empty."""

    @property
    def short_label(self) -> str:
        return self.short or self.label


@dataclass(frozen=True)
class ObjectiveEntry(Entry):
    style: PlotStyle = PlotStyle(BLUE)
    aligns_later_points: bool = False
    """It needs the back model's tensors after the stitch point too (fula)."""
    closed_form: bool = False
    """Solved in closed form, not trained (dm)."""
    labels_only: bool = False
    """It reads the labels only, no output of the back model (the one kind of objective a
    pairing of two tasks can train: no back-model output exists for the front task's inputs)."""
    default: bool = False
    """In a spec that names no objectives."""
    needs_labels: bool = False
    """It trains on the dataset's class labels (hlm): an unlabelled dataset cannot run it."""


@dataclass(frozen=True)
class ProtocolEntry(Entry):
    style: PlotStyle = PlotStyle(BLUE)
    rank: int = 0
    """The verdict reads the figure of the highest-ranked protocol that ran (the first in
    catalogue order among equals)."""
    baseline: bool = False
    """The plain protocol: the drop is its agreement minus the IRI protocol's, and the
    protocol the clustered-noise floor is trained under."""
    uses_iris: bool = False
    """Its training inputs are IRIs (the IRI settings and convergence figures apply)."""
    needs_front_dataset: bool = False
    """It reads the front model's own dataset (spec.front_dataset)."""
    in_controls: bool = True
    """The controls (identity, shortcut) run it too."""
    attacks: bool = False
    """It crafts adversarial inputs while the stitch trains (spec.adversarial applies)."""
    read_against: tuple[str, ...] = ()
    """Controls that run whenever it runs: its figures mean nothing without them."""
    default: bool = False
    """In a spec that names no protocols."""
    needs_labels: bool = False
    """It reads the dataset's class labels: an unlabelled dataset cannot run it."""


@dataclass(frozen=True)
class ControlEntry(Entry):
    band: BandStyle | None = None
    """Drawn as a band behind the comparison's lines (a ceiling or a floor)."""
    paints_cues: bool = False
    """It paints the unseen cues (control_settings.cues): its rows carry a cue."""
    needs_labels: bool = False
    """It is built from the dataset's class labels: an unlabelled dataset cannot run it."""


@dataclass(frozen=True)
class MeasureEntry(Entry):
    style: PlotStyle = PlotStyle(BLUE)


@dataclass(frozen=True)
class MeasureInputEntry(Entry):
    style: PlotStyle = PlotStyle(BLUE)


@dataclass(frozen=True)
class ModelSourceEntry(Entry):
    prefix: str = ""
    """How an `arch` names it: `prefix:NAME` (empty: a plain name)."""


@dataclass(frozen=True)
class OutputKindEntry(Entry):
    needs_labels: bool = True
    """Its agreement or training needs class labels (logits); else labels are optional."""


@dataclass(frozen=True)
class DatasetFormatEntry(Entry):
    suffixes: tuple[str, ...] = ()
    """File name endings the client recognises it by."""
    directory: bool = False
    """The client reads it from a directory too (not only from a file)."""
    needs: tuple[str, ...] = ()
    """Python packages its reader needs beyond the client's own (the `data` extra)."""


@dataclass(frozen=True)
class CaveatEntry(Entry):
    gate: bool = True
    """`stitchsim check --fail-on-caveat` fails on it (else it is reported only)."""


E = TypeVar("E", bound=Entry)


class Kind(Generic[E]):
    """The entries of one kind of name, in their one order (reports, tables and plots list
    them in it). An entry may be added at run time (`register`, as a plug-in does); every
    reader asks the kind when it needs the names, so it sees the entry from then on."""

    def __init__(self, kind: str, entries: Iterable[E] = ()) -> None:
        self.kind = kind
        self.entries: tuple[E, ...] = ()
        for entry in entries:
            self.register(entry)

    def register(self, entry: E) -> E:
        if entry.name in self:
            raise ValueError(f"{self.kind} {entry.name!r} is catalogued twice")
        self.entries = (*self.entries, entry)
        return entry

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def __getitem__(self, name: str) -> E:
        found = self.get(name)
        if found is None:
            raise KeyError(f"unknown {self.kind} {name!r}; one of: {', '.join(self.names)}")
        return found

    def get(self, name: str) -> E | None:
        """The entry, or None for a name this version does not know (a newer service's)."""
        return next((e for e in self.entries if e.name == name), None)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[E]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def label(self, name: str) -> str:
        """The entry's label; an unknown name (a report from a newer service) as written."""
        entry = self.get(name)
        return entry.label if entry else name

    def position(self, name: str) -> int:
        """Where the name sorts: its place in the catalogue, unknown names last."""
        names = self.names
        return names.index(name) if name in names else len(names)

    def ordered(self, names: Iterable[str]) -> list[str]:
        """The distinct names given, in catalogue order (unknown ones last, as first seen)."""
        return sorted(dict.fromkeys(names), key=self.position)

    def where(self, **flags: object) -> tuple[str, ...]:
        """Names of the entries whose fields equal the given values, in order."""
        return tuple(e.name for e in self.entries
                     if all(getattr(e, k) == v for k, v in flags.items()))

    def one(self, **flags: object) -> str:
        """The one name with these flags; a catalogue with none or several is a bug of ours."""
        found = self.where(**flags)
        if len(found) != 1:
            raise LookupError(f"{self.kind}: {len(found)} entries with {flags}, not one")
        return found[0]

    def any_of(self, names: Iterable[str], **flags: object) -> bool:
        """Whether any of the names (a spec's) has these flags."""
        chosen = self.where(**flags)
        return any(n in chosen for n in names)

    def help(self) -> str:
        """One line for CLI help: every name, with its label where that says more."""
        def one(e: E) -> str:
            text = e.label.removesuffix(f" ({e.name})")
            same = text.replace("-", "_").replace(" ", "_") == e.name
            return e.name if same else f"{e.name} ({text})"

        return ", ".join(one(e) for e in self.entries)

    def describe(self) -> str:
        """Every name with its description, for the OpenAPI document."""
        return "; ".join(f"{e.name}: {e.description}" for e in self.entries)


OBJECTIVES: Kind[ObjectiveEntry] = Kind("objective", (
    ObjectiveEntry(
        "hlm", "hard-label matching (hlm)", "cross-entropy of the stitched model against the "
        "labels", short="hlm", style=PlotStyle(BLUE, "-", "o"), labels_only=True,
        needs_labels=True),
    ObjectiveEntry(
        "slm", "soft-label matching (slm)", "KL divergence from the back model's softmax to "
        "the stitched model's (temperature 1)", short="slm",
        style=PlotStyle(VERMILLION, "--", "s"), default=True),
    ObjectiveEntry(
        "dm", "direct matching (dm)", "relative distance to the back model's tensor at the "
        "stitch point, solved in closed form (least squares)", short="dm",
        style=PlotStyle(GREEN, "-.", "D"), closed_form=True),
    ObjectiveEntry(
        "fula", "functional latent alignment (fula)", "mean relative distance to the back "
        "model's tensors at the stitch point and every later block", short="fula",
        style=PlotStyle(PURPLE, ":", "^"), aligns_later_points=True),
))

PROTOCOLS: Kind[ProtocolEntry] = Kind("protocol", (
    ProtocolEntry(
        "standard", "standard", "T is trained on the training split, towards the back "
        "model's processing of it", style=PlotStyle(BLUE, "-", "o"), rank=1, baseline=True,
        default=True),
    ProtocolEntry(
        "invariance_aware", "invariance-aware", "T is trained on IRIs: inputs the front model "
        "cannot tell from the training inputs at the stitch point, towards the back model's "
        "own processing of the IRIs", style=PlotStyle(VERMILLION, "--", "s"), rank=2,
        uses_iris=True, default=True),
    ProtocolEntry(
        "adversarial", "adversarial", "T is trained with a fraction alpha of each batch "
        "replaced by PGD inputs crafted against the stitched model, towards the back model's "
        "processing of the same inputs", style=PlotStyle(ORANGE, "-.", "D"), attacks=True),
    ProtocolEntry(
        "cross_task", "cross-task", "front and back models of different tasks: T is trained "
        "with the front model's own images and hard labels paired into the back model's "
        "classes; it measures compatibility, not shared meaning (read it against the "
        "clustered-noise floor)", style=PlotStyle(GREY, ":", "^"),
        needs_front_dataset=True, in_controls=False, read_against=("clustered_noise",),
        needs_labels=True),
))

CONTROLS: Kind[ControlEntry] = Kind("control", (
    ControlEntry(
        "clustered_noise", "clustered noise", "one noise centre per class fed through T into "
        "the back model: the accuracy a representation with nothing but class clusters "
        "reaches (the floor)", short="noise floor",
        band=BandStyle(GREY, "clustered-noise floor", hatch="///"), needs_labels=True),
    ControlEntry(
        "identity", "identity", "the back model stitched into itself at the same point: "
        "agreement near 1 is the ceiling and a sanity check", short="ceiling",
        band=BandStyle(GREEN, "identity ceiling")),
    ControlEntry(
        "shortcut", "unseen cues", "class markers neither model saw, painted onto the "
        "stitch-training inputs: agreement that falls when the markers are rolled by one "
        "class was bought by the marker (excessive agreement)", short="unseen cues",
        paints_cues=True, needs_labels=True),
))

CUES: Kind[Entry] = Kind("cue", (
    Entry("pixel_specific", "class colour, class place",
          "a class-coloured square at a class-specific place"),
    Entry("pixel_rand", "class colour, random place", "a class-coloured square at a random "
          "place"),
    Entry("rand_rand", "random colour, random place", "a randomly coloured square at a random "
          "place: no class information (the ~0 control)"),
))

MEASURES: Kind[MeasureEntry] = Kind("measure", (
    MeasureEntry(
        "cka", "linear CKA", "linear centred kernel alignment, unbiased HSIC accumulated over "
        "mini-batches", style=PlotStyle(BLUE, "-", "o")),
    MeasureEntry(
        "mutual_knn", "mutual k-NN", "the share of each sample's k nearest neighbours the two "
        "representations have in common", style=PlotStyle(GREEN, "--", "s")),
))

MEASURE_INPUTS: Kind[MeasureInputEntry] = Kind("measure input", (
    MeasureInputEntry("real", "real inputs", "the test split's images",
                      style=PlotStyle(BLUE, "-", "o")),
    MeasureInputEntry("iri", "IRIs", "the front model's IRIs: both models' activations on them",
                      style=PlotStyle(VERMILLION, "--", "s")),
))

MODEL_SOURCES: Kind[ModelSourceEntry] = Kind("model source", (
    ModelSourceEntry(
        "timm", "timm", "a timm registry name (plain names are timm), built with "
        "pretrained=False and loaded strictly from the checkpoint"),
))

OUTPUT_KINDS: Kind[OutputKindEntry] = Kind("output kind", (
    OutputKindEntry(
        "logits", "logits", "a classifier's class scores: agreement of the softmaxes, hard "
        "agreement, accuracy and error consistency"),
))

_IMAGE_PACKAGES = ("numpy", "PIL")
DATASET_FORMATS: Kind[DatasetFormatEntry] = Kind("dataset format", (
    DatasetFormatEntry(
        "safetensors", "safetensors", "the service's own file: train_images and test_images "
        "(uint8 N x C x H x W, or float in [0,1]), train_labels and test_labels (integers; "
        "both or neither); uploaded as it is", suffixes=(".safetensors",), needs=("numpy",)),
    DatasetFormatEntry(
        "imagefolder", "ImageFolder", "one folder per class holding its images (PNG, JPEG, "
        "...), optionally under train/ and test/; a directory, or a zip or tar of one",
        suffixes=(".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"), directory=True,
        needs=_IMAGE_PACKAGES),
    DatasetFormatEntry(
        "parquet", "parquet", "a table with an image column (encoded bytes, or the "
        "{bytes, path} struct Hugging Face datasets exports) and a label column (integers or "
        "names)", suffixes=(".parquet",), needs=(*_IMAGE_PACKAGES, "pyarrow")),
    DatasetFormatEntry(
        "npz", "NumPy .npz", "arrays named x_train, y_train, x_test, y_test (or "
        "train_images, train_labels, test_images, test_labels; or images, labels): images "
        "N x H x W (x C) or N x C x H x W", suffixes=(".npz",), needs=_IMAGE_PACKAGES),
    DatasetFormatEntry(
        "webdataset", "WebDataset", "a tar of samples grouped by key: an image file "
        "(KEY.jpg, KEY.png ...) and its label (KEY.cls, KEY.txt or KEY.json)",
        suffixes=(".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"), needs=_IMAGE_PACKAGES),
))

CAVEATS: Kind[CaveatEntry] = Kind("caveat", (
    CaveatEntry(
        "iri_unconverged", "unconverged IRIs", "the similarity figure's protocol trained on "
        "IRIs whose median distance stayed above iri.converged_below at a stitch point: the "
        "front model can still tell them from real inputs (raise iri.steps or iri.step_size)"),
    CaveatEntry(
        "near_chance", "model at chance", "a model's accuracy on the dataset cannot be told "
        "from guessing, so agreement with it means nothing (check the dataset, arch_kwargs "
        "and preprocessing)"),
))
"""What weakens a report's figures, as machine-readable codes beside the prose
(`Report.caveats`); found from the report's own figures by stitchsim.caveats."""

KINDS: tuple[Kind[Entry], ...] = (  # type: ignore[assignment]
    OBJECTIVES, PROTOCOLS, CONTROLS, CUES, MEASURES, MEASURE_INPUTS, MODEL_SOURCES,
    OUTPUT_KINDS, DATASET_FORMATS, CAVEATS,
)
"""Every kind of name, for the tests that hold each against its engine registry and render
every entry."""


def drop_protocols() -> tuple[str, str]:
    """The drop's two protocols: the baseline's agreement minus the IRI protocol's (the share
    of the plain score that came from features the end model does not share)."""
    return PROTOCOLS.one(baseline=True), PROTOCOLS.one(uses_iris=True)
