"""The catalogue: every name a user can write, with its label, description, plot style,
preference rank and flags. One entry a name; nothing else in the project spells the
vocabulary out.

The contract's `Literal` types (stitchsim.models.vocabulary) are built from these entries, so
the spec validates against them; the view's labels, the page's plot styles, the verdict's
protocol preference, the CLI help and the OpenAPI descriptions are read from them; the engine's
registries attach behaviour to the same names, and a test holds the two 1 : 1. Adding an
objective, a protocol, a measure or a row figure is its entry here plus its entry in the
engine.

Standard library only: the client, the gateway (no torch) and the engine all import it.
"""

from __future__ import annotations

import re

from stitchsim.entries import (
    BLACK as BLACK,
    BLUE as BLUE,
    COLOR_NAMES as COLOR_NAMES,
    GREEN as GREEN,
    GREY as GREY,
    LINE_NAMES as LINE_NAMES,
    ORANGE as ORANGE,
    PURPLE as PURPLE,
    SKY as SKY,
    VERMILLION as VERMILLION,
    YELLOW as YELLOW,
    AttackEntry as AttackEntry,
    BandStyle as BandStyle,
    BudgetEntry as BudgetEntry,
    CaveatEntry as CaveatEntry,
    ControlEntry as ControlEntry,
    DatasetFormatEntry as DatasetFormatEntry,
    Entry as Entry,
    IRIMethodEntry as IRIMethodEntry,
    Kind as Kind,
    MeasureEntry as MeasureEntry,
    MeasureInputEntry as MeasureInputEntry,
    ModelSourceEntry as ModelSourceEntry,
    ObjectiveEntry as ObjectiveEntry,
    OutputKindEntry as OutputKindEntry,
    PlotStyle as PlotStyle,
    ProtocolEntry as ProtocolEntry,
    ReferenceEntry as ReferenceEntry,
    ResolutionEntry as ResolutionEntry,
    RowFigureEntry as RowFigureEntry,
)

OBJECTIVES: Kind[ObjectiveEntry] = Kind("objective", (
    ObjectiveEntry(
        "hlm", "hard-label matching (hlm)", "cross-entropy of the stitched model against the "
        "labels", style=PlotStyle(BLUE, "-", "o"), labels_only=True,
        needs_labels=True, needs_classes=True),
    ObjectiveEntry(
        "slm", "soft-label matching (slm)", "KL divergence from the back model's softmax to "
        "the stitched model's (temperature 1); for a back model whose output is an embedding "
        "or an image, its output kind's output matching",
        style=PlotStyle(VERMILLION, "--", "s"), default=True),
    ObjectiveEntry(
        "dm", "direct matching (dm)", "relative distance to the back model's tensor at the "
        "stitch point, solved in closed form (least squares)",
        style=PlotStyle(GREEN, "-.", "D"), closed_form=True),
    ObjectiveEntry(
        "fula", "functional latent alignment (fula)", "mean relative distance to the back "
        "model's tensors at the stitch point and every later block output up to the last "
        "block, as the invariance-aware paper's FuLA (fula.points: stages for stage outputs "
        "only)",
        style=PlotStyle(PURPLE, ":", "^"), aligns_later_points=True),
))

PROTOCOLS: Kind[ProtocolEntry] = Kind("protocol", (
    ProtocolEntry(
        "standard", "standard", "T is trained on the training split, towards the back "
        "model's processing of it", style=PlotStyle(BLUE, "-", "o"), rank=1,
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
        "iri_adversarial", "invariance-aware x adversarial", "T is trained on IRIs (as "
        "invariance-aware) with a fraction alpha of each batch replaced by PGD inputs crafted "
        "against the stitched model from those IRIs, towards the back model's processing of "
        "the same inputs: the invariance-aware paper's IRI x adversarial arm",
        style=PlotStyle(PURPLE, "--", "v"), uses_iris=True,
        attacks=True),
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
        "reaches (the floor); on data without labels the classes are pseudo-classes (k-means "
        "of the back model's outputs)",
        band=BandStyle(GREY, "clustered-noise floor", hatch="///")),
    ControlEntry(
        "identity", "identity", "the back model stitched into itself at the same point: "
        "agreement near 1 is the ceiling and a sanity check",
        band=BandStyle(GREEN, "identity ceiling")),
    ControlEntry(
        "shortcut", "unseen cues", "class markers neither model saw, painted onto the "
        "stitch-training inputs: agreement that falls when the markers are rolled by one "
        "class was bought by the marker (excessive agreement); on data without labels the "
        "classes are pseudo-classes (k-means of the back model's outputs)",
        paints_cues=True),
))

CUES: Kind[Entry] = Kind("cue", (
    Entry("pixel_specific", "class colour, class place",
          "a class-coloured square at a class-specific place"),
    Entry("pixel_rand", "class colour, random place", "a class-coloured square at a random "
          "place"),
    Entry("rand_rand", "random colour, random place", "a randomly coloured square at a random "
          "place: no class information (the ~0 control)"),
))

ATTACKS: Kind[AttackEntry] = Kind("attack", (
    AttackEntry(
        "autoattack_paper", "AutoAttack (APGD-CE + APGD-DLR) as the paper ran it",
        "the invariance-aware paper's robust evaluation: ART's AutoAttack([APGD-CE, "
        "APGD-DLR]) with one uniform random start in the epsilon ball, a first step of "
        "adversarial.eval_step_size (2/255) halved at APGD's checkpoints, 20 iterations per "
        "loss; only the inputs the model classifies right are attacked, and an input keeps "
        "its clean pixels unless an attack fools the model on it (ART 1.19, the version the "
        "paper's code ships)", default=True, steps=20,
        step_size=True),
    AttackEntry(
        "apgd", "APGD-CE + APGD-DLR (Croce's reference)", "AutoAttack's two white-box attacks "
        "as Croce & Hein's reference code runs them (2020): a first step of 2 epsilon, a start "
        "scaled to the epsilon ball's corner, every input attacked; APGD on the "
        "cross-entropy, then on the difference-of-logits ratio for the inputs it did not "
        "fool; per input the fooling iterate, else the highest-loss one. Stronger than "
        "autoattack_paper", steps=20),
    AttackEntry(
        "pgd", "PGD-k", "k fixed steps of adversarial.eval_step_size along the "
        "cross-entropy gradient's sign (Madry et al. 2018), projected onto the epsilon ball; "
        "random start with adversarial.random_start", steps=10, step_size=True),
))

MEASURES: Kind[MeasureEntry] = Kind("measure", (
    MeasureEntry(
        "cka", "linear CKA", "linear centred kernel alignment, unbiased HSIC accumulated over "
        "mini-batches", style=PlotStyle(BLUE, "-", "o")),
    MeasureEntry(
        "mutual_knn", "mutual k-NN", "the share of each sample's k nearest neighbours the two "
        "representations have in common", style=PlotStyle(GREEN, "--", "s")),
))

ROW_FIGURES: Kind[RowFigureEntry] = Kind("row figure", (
    RowFigureEntry(
        "agreement", "agreement", "soft agreement of the stitched model with the model it "
        "ends in: <p_h, p_g> / max(|p_h|^2, |p_g|^2) of the softmaxes, 1 iff they match "
        "(the paper's agreement_prob); for outputs without classes, the output kind's "
        "agreement", column="agreement", interval_shown=True),
    RowFigureEntry(
        "hard_agreement", "hard agreement (same class)", "the share of test samples on which "
        "both models predict the same class; for outputs without classes, retrieval "
        "agreement", column="hard agr"),
    RowFigureEntry(
        "correct_agreement", "correct agreement (both right or both wrong)", "the share of "
        "test samples on which both models are right or both are wrong, whatever class each "
        "wrong one picks (the paper's hard_agreement, agreement_ratio)", column="both r/w"),
    RowFigureEntry("accuracy", "accuracy", "the stitched model's accuracy on the test split",
                   column="accuracy"),
    RowFigureEntry(
        "error_consistency", "Cohen's kappa (error consistency)", "kappa of 'h is right' "
        "against 'g is right': correct agreement corrected for what two independent models "
        "of these accuracies reach (the paper's hard_k_consistency)", column="kappa"),
    RowFigureEntry(
        "soft_kappa", "soft kappa", "soft error consistency: kappa of the soft agreement "
        "against a b + (1 - a)(1 - b) / (K - 1), a and b the models' mean softmax probability "
        "of the true class (the paper's soft_k_consistency)", column="soft kappa"),
    RowFigureEntry(
        "psnr", "PSNR", "image outputs: the mean peak signal-to-noise ratio of the stitched "
        "model's output against the back model's, peak = the back model's output range "
        "(capped at 100 dB for an exact copy)", column="PSNR dB", digits=1, unit="dB",
        classes=False),
))
"""Every figure a result row may carry, in the order tables show them: a new figure is its
entry here and its statistic in the engine (stitchsim_worker.engine.measures.metrics)."""

UNSTITCHED = ReferenceEntry(
    "unstitched_agreement", "no stitch (whole models)", "the model in front position against "
    "the model the stitched network ends in, whole and unstitched, on the same test split: "
    "the endpoint every agreement curve is read against (the invariance-aware paper's plots "
    "end in it)", style=PlotStyle(BLACK, ":", "X"))
"""The agreement plots' endpoint: drawn at the deep end of every agreement panel, in the
paper's style (a black X, a dotted line)."""

MEASURE_INPUTS: Kind[MeasureInputEntry] = Kind("measure input", (
    MeasureInputEntry("real", "real inputs", "the test split's images",
                      style=PlotStyle(BLUE, "-", "o")),
    MeasureInputEntry("iri", "IRIs", "the front model's IRIs: both models' activations on them",
                      style=PlotStyle(VERMILLION, "--", "s")),
))

MODEL_SOURCES: Kind[ModelSourceEntry] = Kind("model source", (
    ModelSourceEntry(
        "timm", "timm", "a timm registry name (plain names are timm), built with "
        "pretrained=False and loaded strictly from the checkpoint; a hub-layout folder's "
        "config.json gives the name, kwargs and preprocessing", prefix="timm", plain=True),
    ModelSourceEntry(
        "torchvision", "torchvision", "a torchvision.models.list_models() name "
        "(torchvision:resnet50), built with weights=None; preprocessing from the "
        "architecture's own weights' transforms", prefix="torchvision"),
    ModelSourceEntry(
        "transformers", "Hugging Face transformers", "a model class that transformers ships "
        "(transformers:ViTForImageClassification), built with from_config from the "
        "checkpoint's config.json (save_pretrained's folder); never remote code, never a hub "
        "download; preprocessing from preprocessor_config.json when present",
        prefix="transformers"),
    ModelSourceEntry(
        "stitchsim", "stitchsim's own", "architectures the service ships itself "
        "(stitchsim:NAME), such as the autoencoders of its experiments", prefix="stitchsim"),
    ModelSourceEntry(
        "plugin", "operator plugin", "architectures a deployment installs into its worker "
        "image under the Python entry-point group stitchsim.architectures (plugin:NAME); no "
        "uploaded code ever runs", prefix="plugin"),
))

OUTPUT_KINDS: Kind[OutputKindEntry] = Kind("output kind", (
    OutputKindEntry(
        "logits", "logits", "a classifier's class scores: agreement of the softmaxes, hard "
        "agreement, accuracy and error consistency; trained by the objectives as they are"),
    OutputKindEntry(
        "embedding", "embedding", "a vector per input (timm with num_classes=0, a pooled "
        "encoder output): agreement is the mean cosine similarity of the stitched and the back "
        "model's outputs, hard agreement the nearest-neighbour retrieval agreement (the "
        "stitched output's nearest back-model output on the test split is its own input's); "
        "slm trains by output matching (1 - cosine)", needs_labels=False, classes=False,
        agreement="cosine similarity", hard_agreement="retrieval agreement"),
    OutputKindEntry(
        "image", "image", "an image per input (an autoencoder, image-to-image): agreement is "
        "1 - the relative reconstruction error against the back model's own output (per "
        "sample, at least 0), with the PSNR beside it and nearest-neighbour retrieval "
        "agreement as hard agreement; slm trains by output matching (relative squared error)",
        needs_labels=False, classes=False, agreement="1 - relative error",
        hard_agreement="retrieval agreement", psnr=True, grid=True),
))

IRI_METHODS: Kind[IRIMethodEntry] = Kind("IRI method", (
    # Every preset names the same fields, so switching methods leaves nothing of the other.
    IRIMethodEntry(
        "paper", "the paper's code", "as the invariance-aware paper's code makes IRIs "
        "(external/attacks/pgd_iris.py): from uniform noise, 200 steps of exactly 1/255 "
        "against the sign of each step's own gradient (on inputs of 85 px and up, the "
        "paper's 224 px step, 5.38/255: RESOLUTIONS), the last iterate kept, no early "
        "stopping; then, while a batch's median distance is short of the convergence line, "
        "further rounds of 100 of the same steps (at most 10: 1,200 steps a sample), so the "
        "verdict rests on IRIs that finished (iri.extra_rounds 0: exactly the paper's 200)",
        default=True,
        preset=(("steps", 200), ("step_size", None), ("momentum", 0.0),
                ("schedule", "constant"), ("cycle_steps", 200), ("extra_rounds", 10),
                ("extra_round_steps", 100), ("extra_round_growth", 1), ("stop_below", None),
                ("iterate", "last"), ("extra_rounds_stop_at_aim", False))),
    IRIMethodEntry(
        "fast", "fast (momentum)", "the service's default before issue 26: MI-FGSM momentum 0.9, a "
        "cosine schedule peaking at 32/255 over 100-step cycles, each sample's best iterate, "
        "early stopping below 0.02 and up to 6 extra rounds while the median is short of the "
        "convergence line (700 steps at most); fewer steps, but its figures depend on where "
        "the optimiser lands (bench/iri_methods.py)",
        preset=(("steps", 100), ("step_size", 32 / 255), ("momentum", 0.9),
                ("schedule", "cosine"), ("cycle_steps", 100), ("extra_rounds", 6),
                ("extra_round_steps", None), ("extra_round_growth", 1), ("stop_below", 0.02),
                ("iterate", "best"), ("extra_rounds_stop_at_aim", False))),
))

# The paper's 224 px configs (configs/*/high_resolution/**) write their steps in ImageNet-
# normalised units, as k x 4.758/255: 4.758 is the normalised range's width over the channels
# ((1 - 0.406) / 0.225 + 0.485 / 0.229). One normalised unit is std_c pixels in channel c; the
# engine steps in [0,1] pixels with one step for every channel, so a normalised step becomes
# the channels' mean std in pixels (within 1.4 % of each channel's own).
_PAPER_NORMALISED_RANGE = 4.758
_IMAGENET_STD = (0.229, 0.224, 0.225)


def _paper_224px_step(k: float) -> float:
    """The paper's 224 px step k x 4.758/255 (ImageNet-normalised) in [0,1] pixels."""
    return k * _PAPER_NORMALISED_RANGE / 255 * sum(_IMAGENET_STD) / len(_IMAGENET_STD)


RESOLUTIONS: Kind[ResolutionEntry] = Kind("resolution", (
    # The cut-off: the paper runs 32 px and 224 px only; a side takes the preset of the one it
    # is nearer to by ratio (sqrt(32 x 224) = 84.7): 64 px (Tiny ImageNet) is low, 96 px
    # (STL-10) and up high.
    ResolutionEntry(
        "low", "low resolution (32 px)", "inputs under 85 px (the shorter side of the "
        "dataset's images): the paper's 32 px (CIFAR) configs, IRI steps of 1/255, training "
        "PGD epsilon 8/255 with steps of 2/255, the robust evaluation at the same",
        min_side=0, iri_step_size=1 / 255, epsilon=8 / 255, step_size=2 / 255),
    ResolutionEntry(
        "high", "high resolution (224 px)", "inputs of 85 px and more: the paper's 224 px "
        "(ImageNet-100) configs, IRI steps of 5 x 4.758/255 and training PGD epsilon "
        "4 x 4.758/255 with steps of 4.758/255 in ImageNet-normalised units (5.38/255, "
        "4.30/255 and 1.08/255 in pixels), the robust evaluation at the same",
        min_side=85, iri_step_size=_paper_224px_step(5), epsilon=_paper_224px_step(4),
        step_size=_paper_224px_step(1)),
))
"""The step sizes a spec leaves unset, by the size of its inputs, as the paper's configs set
them at its two resolutions; the engine picks the entry (resolution_of) after reading the
data, and a value the spec sets wins."""


def resolution_of(side: int) -> str:
    """The resolution preset of images whose shorter side is `side` pixels."""
    return max((e for e in RESOLUTIONS if side >= e.min_side), key=lambda e: e.min_side).name


BUDGETS: Kind[BudgetEntry] = Kind("budget", (
    BudgetEntry("full", "full", "every sample and stitch point the spec asks for",
                default=True),
    BudgetEntry(
        "ci", "CI", "the default method on fewer samples and points, for a gate run on every "
        "pull request: 64 training samples for the stitch and its IRIs (the IRIs are most of "
        "a check's cost), or as many as the hungriest stitch point needs for 10 activation "
        "vectors per unknown of its affine map; at most 2 of the points `layers: auto` picks "
        "(the first and the last). The test samples and a listed `layers` are "
        "the spec's, and fields the spec sets win. Its decisions against the full budget's "
        "on the drift series: docs/benchmarks.md, Drift power",
        train_samples=64, points=2),
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
        "front model can still tell them from real inputs; without iri.accept_unconverged the "
        "verdict is withheld (raise iri.extra_rounds or iri.steps)"),
    CaveatEntry(
        "near_chance", "model at chance", "a model's accuracy on the dataset cannot be told "
        "from guessing, so agreement with it means nothing (check the dataset, arch_kwargs "
        "and preprocessing)"),
))
"""What weakens a report's figures, as machine-readable codes beside the prose
(`Report.caveats`); found from the report's own figures by stitchsim.caveats."""

KINDS: tuple[Kind[Entry], ...] = (  # type: ignore[assignment]
    OBJECTIVES, PROTOCOLS, CONTROLS, CUES, ATTACKS, MEASURES, ROW_FIGURES, MEASURE_INPUTS,
    MODEL_SOURCES, OUTPUT_KINDS, DATASET_FORMATS, IRI_METHODS, CAVEATS, BUDGETS, RESOLUTIONS,
)
"""Every kind of name, for the tests that hold each against its engine registry and render
every entry."""


BASELINE_PROTOCOL = "standard"
"""The baseline protocol: the plain one, the drop's first term, and the protocol the
clustered-noise floor is trained under."""
IRI_PROTOCOL = "invariance_aware"
"""The IRI protocol: the drop's second term, and the IRIs the measures read (its adversarial
arm uses IRIs too, but it also attacks)."""


def _check_roles() -> None:
    """The roles name protocols of the catalogue, and the flags those protocols carry agree
    with their roles: a bug of ours, found at import."""
    baseline, iri = PROTOCOLS[BASELINE_PROTOCOL], PROTOCOLS[IRI_PROTOCOL]
    if baseline.uses_iris or baseline.attacks or not baseline.in_controls:
        raise ValueError(f"the baseline protocol {baseline.name!r} must be plain")
    if not iri.uses_iris or iri.attacks or not iri.in_controls:
        raise ValueError(f"the IRI protocol {iri.name!r} must train on IRIs and attack nothing")


_check_roles()


def drop_protocols() -> tuple[str, str]:
    """The drop's two protocols: the baseline's agreement minus the IRI protocol's (the share
    of the plain score that came from features the end model does not share)."""
    return BASELINE_PROTOCOL, IRI_PROTOCOL


def split_arch(arch: str) -> tuple[str, str]:
    """(source, name) of an `arch`: `torchvision:resnet50`; a plain name is the plain source's.
    An unknown prefix comes back as it is (the caller says what is wrong with it)."""
    prefix, sep, name = arch.partition(":")
    if not sep:
        return MODEL_SOURCES.one(plain=True), arch
    for entry in MODEL_SOURCES:
        if entry.prefix == prefix:
            return entry.name, name
    return prefix, name


def _arch_pattern() -> str:
    # A catalogued prefix or none, then a name that is not a path or a hub reference (no / \\
    # or :, no leading dot) and has no surrounding whitespace; the OpenAPI document publishes it.
    prefixes = "|".join(re.escape(e.prefix) for e in MODEL_SOURCES if e.prefix)
    return rf"^(?:(?:{prefixes}):)?[^\s./\\:](?:[^/\\:]*[^\s/\\:])?$"


ARCH_PATTERN = _arch_pattern()
"""What `arch` may be: a registry name of a catalogued source; no hub (`hf-hub:`), no path
(`local-dir:`)."""


def arch_name_ok(arch: str) -> bool:
    """Whether arch is a registry name of a catalogued source (ARCH_PATTERN)."""
    return re.fullmatch(ARCH_PATTERN, arch) is not None
