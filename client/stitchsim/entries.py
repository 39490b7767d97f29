"""The catalogue's types: an entry of each kind with its fields and flags, the plot and
band styles (Okabe & Ito's colour-blind-safe palette) and `Kind`, the ordered entries of one
kind of name. The entries themselves are in stitchsim.catalogue.

Standard library only, as the catalogue.
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
    needs_classes: bool = False
    """It reads the stitched model's outputs as class scores (hlm): a back model whose output
    kind has no classes (an embedding, an image) cannot train with it."""


@dataclass(frozen=True)
class ProtocolEntry(Entry):
    style: PlotStyle = PlotStyle(BLUE)
    rank: int = 0
    """The verdict reads the figure of the highest-ranked protocol that ran (the first in
    catalogue order among equals)."""
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
    """It is built from the dataset's class labels and has no pseudo-classes to fall back on:
    an unlabelled dataset cannot run it."""


@dataclass(frozen=True)
class MeasureEntry(Entry):
    style: PlotStyle = PlotStyle(BLUE)


@dataclass(frozen=True)
class RowFigureEntry(Entry):
    """A figure every result row (and the no-stitch endpoint) may carry, with its interval."""

    column: str = ""
    """Its column header in tables (the terminal's, the page's): short, ASCII."""
    digits: int = 3
    """Decimal places it is written with."""
    unit: str = ""
    higher_is_better: bool = True
    """Higher means the stitched model behaves more like the model it ends in."""
    interval_shown: bool = False
    """Tables show its interval beside it (the headline figure); the JSON has every one's."""
    classes: bool = True
    """Scored from class outputs (logits) by the engine's figure registry; False: an output
    kind without classes scores it itself (psnr: images)."""


@dataclass(frozen=True)
class MeasureInputEntry(Entry):
    style: PlotStyle = PlotStyle(BLUE)


@dataclass(frozen=True)
class ReferenceEntry(Entry):
    """A reference figure drawn on plots beside the series (not a name a user writes)."""

    style: PlotStyle = PlotStyle(BLACK)


@dataclass(frozen=True)
class ModelSourceEntry(Entry):
    prefix: str = ""
    """How an `arch` names it: `prefix:NAME`."""
    plain: bool = False
    """A plain name (no `prefix:`) is this source's."""


@dataclass(frozen=True)
class AttackEntry(Entry):
    default: bool = False
    """The robust evaluation's attack in a spec that names none."""
    steps: int = 10
    """Iterations it runs when adversarial.eval_steps is unset (each loss's, for APGD)."""
    step_size: bool = False
    """It steps by adversarial.eval_step_size (else its step follows from epsilon)."""


@dataclass(frozen=True)
class OutputKindEntry(Entry):
    needs_labels: bool = True
    """Its agreement or training needs class labels (logits); else labels are optional."""
    classes: bool = True
    """Its outputs are class scores: the model has an accuracy, a stitched model has a
    stitching penalty and an error consistency, and class-label objectives apply."""
    agreement: str = "agreement"
    """What its agreement figure is called (the page's and table's column, the plot's axis)."""
    hard_agreement: str = "hard agreement"
    """What its second agreement figure (hard_agreement in a row) is called."""
    psnr: bool = False
    """Its rows carry a peak signal-to-noise ratio (psnr) beside the agreement."""
    grid: bool = False
    """Its outputs are pictures: the report shows samples of them (inputs, the back model's
    outputs, the stitched model's) as an image grid."""


@dataclass(frozen=True)
class DatasetFormatEntry(Entry):
    suffixes: tuple[str, ...] = ()
    """File name endings the client recognises it by."""
    directory: bool = False
    """The client reads it from a directory too (not only from a file)."""
    needs: tuple[str, ...] = ()
    """Python packages its reader needs beyond the client's own (the `data` extra)."""


@dataclass(frozen=True)
class IRIMethodEntry(Entry):
    preset: tuple[tuple[str, object], ...] = ()
    """The iri settings it stands for (field, value); a field the spec sets wins over it."""
    default: bool = False
    """The method of a spec that names none."""

    @property
    def settings(self) -> dict[str, object]:
        return dict(self.preset)


@dataclass(frozen=True)
class ResolutionEntry(Entry):
    """The step sizes a spec leaves unset, for inputs of this size: [0,1] pixel units, as the
    engine steps (each model's normalisation applies after the step)."""

    min_side: int = 0
    """It applies to images whose shorter side is at least this (the largest such wins)."""
    iri_step_size: float = 0.0
    """iri.step_size of the methods whose preset leaves it to the resolution (paper)."""
    epsilon: float = 0.0
    """adversarial.epsilon: the training PGD's (and, unset eval_epsilon, the evaluation's)."""
    step_size: float = 0.0
    """adversarial.step_size: the training PGD's step (and, unset eval_step_size, the
    evaluation attack's)."""

    @property
    def adversarial(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "step_size": self.step_size}


@dataclass(frozen=True)
class BudgetEntry(Entry):
    train_samples: int | None = None
    """Training samples (for the stitch and its IRIs) where the spec sets none: at least this
    many, more where a stitch point needs them to fit its unknowns (the engine resolves it at
    the job's points); None: the spec's."""
    points: int | None = None
    """At most this many of the points `layers: "auto"` picks: the first and the last, evenly
    spaced ones between; None: all of them. A listed `layers` is kept as it is: its mean is
    the figure a gate compares, and a thinned list would compare another one."""
    default: bool = False


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
