"""The spec's settings: how stitches train, how IRIs are made, what controls, attacks,
measures and FuLA use (every default lives here; spec.py assembles them)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from stitchsim import catalogue
from stitchsim.models.vocabulary import (
    Attack,
    Cue,
    IRIMethod,
)


class StrictModel(BaseModel):
    """A contract model that refuses unknown fields (a typo is an error, not a default) and
    infinite or NaN numbers (no standard JSON holds them: a job storing one could not answer
    with its own spec)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


T = TypeVar("T")


def _no_repeats(v: list[T]) -> list[T]:
    if len(set(v)) != len(v):
        raise ValueError("values must not repeat")
    return v


Unique = Annotated[list[T], AfterValidator(_no_repeats),
                   Field(json_schema_extra={"uniqueItems": True})]
"""A list whose values must not repeat; the JSON schema says so too (uniqueItems)."""


class TrainSettings(StrictModel):
    epochs: int = Field(default=10, ge=1, le=1000)
    batch_size: int = Field(default=128, ge=1, le=8192)
    lr: float = Field(default=1e-3, gt=0, le=10)
    weight_decay: float = Field(default=1e-4, ge=0, le=1)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    seeds: int = Field(
        default=1, ge=1, le=20, description="independent runs; >1 gives CIs over seeds"
    )
    init_samples: int = Field(
        default=512, ge=1, le=100_000, description="samples for the least-squares init"
    )
    max_train_samples: int | None = Field(default=None, ge=10)
    max_test_samples: int | None = Field(default=None, ge=10)


IRISchedule = Literal["cosine", "constant"]
IRIIterate = Literal["best", "last"]
IRIPrecision = Literal["fp32", "bf16"]
MAX_IRI_STEPS = 20_000  # per sample, extra rounds included


def _preset(field: str) -> Any:
    """The default method's value of a preset field: the schema's default (a spec that names
    no method gets it through the preset, not through this)."""
    return catalogue.IRI_METHODS[catalogue.IRI_METHODS.one(default=True)].settings[field]


class IRISettings(StrictModel):
    """How IRIs are synthesised (docs/method.md): signed-gradient steps from uniform noise.

    `method` names a preset of the step fields (catalogue.IRI_METHODS): `paper` (the default)
    is the invariance-aware paper's code, 200 constant steps of 1/255 on each step's own
    gradient (its step left to the input resolution, `at`: the paper's 224 px step on inputs
    of 85 px and up), the last iterate, run on in rounds of 100 of the same steps while the
    median is short of the convergence line (`extra_rounds: 0`: exactly the paper's 200);
    `fast` is the service's earlier default (momentum, cosine schedule, best iterate, early
    stopping, extra rounds; bench/iri_methods.py compares them).
    A field the spec sets wins over the preset; the fields it leaves unset take the preset's
    value (`overrides()` lists the ones that differ from it).
    """

    method: IRIMethod = Field(
        default=catalogue.IRI_METHODS.one(default=True),
        description="the preset of the step fields below: " + catalogue.IRI_METHODS.describe(),
    )
    steps: int = Field(default=_preset("steps"), ge=1, le=10_000,
                       description="steps of the first round")
    step_size: float | None = Field(
        default=_preset("step_size"), gt=0, le=1,
        description="in [0,1] pixel units: the peak step (cosine) or the fixed step (constant); "
        "null: from the input resolution (" + catalogue.RESOLUTIONS.describe() + "; the "
        "report's iri_settings gives the step that ran). The paper method leaves it null, "
        "fast's is 32/255",
    )
    momentum: float = Field(
        default=_preset("momentum"), ge=0, lt=1,
        description="each step follows the sign of a running sum of the sample's gradients "
        "(each scaled to unit mean magnitude), decayed by this factor per step (MI-FGSM): a "
        "direction that holds across steps is kept through the oscillation of plain signed "
        "steps; 0: the sign of the step's own gradient (the paper's method)",
    )
    schedule: IRISchedule = Field(
        default=_preset("schedule"),
        description="cosine: the step falls from step_size to ~0 over each cycle, then "
        "restarts; constant: every step is step_size (the paper's method)",
    )
    cycle_steps: int = Field(
        default=_preset("cycle_steps"), ge=1, le=10_000,
        description="length of a cosine cycle in the first round; each extra round's is "
        "extra_round_growth times the one before",
    )
    extra_rounds: int = Field(
        default=_preset("extra_rounds"), ge=0, le=20,
        description="convergence-driven mode: while a batch's median distance is at or above "
        "0.9 x converged_below, run another round, at most this many times (0: off, the "
        "paper's exact 200 steps under the paper method); the cap is the sum of the rounds "
        "(max_steps: 1,200 under the paper method, 700 under fast)",
    )
    extra_round_steps: int | None = Field(
        default=_preset("extra_round_steps"), ge=1, le=10_000,
        description="steps of the first extra round (each later one extra_round_growth times "
        "the one before); null: extra_round_growth times the first round's steps. Shorter "
        "rounds check the median more often, so a batch stops nearer the steps it needs",
    )
    extra_round_growth: int = Field(
        default=_preset("extra_round_growth"), ge=1, le=2,
        description="each extra round (and its cosine cycle) is this many times as long as the "
        "one before: 1 checks the median after every cycle of cycle_steps, so a batch stops "
        "as soon as it is converged; 2 (the first releases) lengthens the cycles",
    )
    stop_below: float | None = Field(
        default=_preset("stop_below"), gt=0, le=1,
        description="per-sample early stopping: a sample whose distance falls below this stops "
        "(and leaves the batch); null: every sample takes every step. Changes figures slightly",
    )
    iterate: IRIIterate = Field(
        default=_preset("iterate"),
        description="which iterate each sample keeps: best (the lowest distance it reached) "
        "or last (where its last step landed, as the paper's code does)",
    )
    linf: float | None = Field(
        default=None, gt=0, le=1, description="optional L-inf bound of |x' - x|"
    )
    extra_rounds_stop_at_aim: bool = Field(
        default=_preset("extra_rounds_stop_at_aim"),
        description="true: in an extra round, a sample below the rounds' aim (0.9 x "
        "converged_below) leaves the batch, at the start or when it gets there, so the rounds "
        "step only the samples that keep the median up: fewer steps, but the IRIs end just "
        "under the aim instead of closer. false: every live sample takes every extra step",
    )
    fast_kernels: bool = Field(
        default=True,
        description="CPU: channels-last images for convolutional fronts, and the native "
        "kernel for the input gradient of the convolution that reads the pixels (oneDNN's is "
        "slow for 3 input channels). The same steps; float rounding differs slightly. false: "
        "the kernels of the first releases",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    batch_size: int = Field(default=256, ge=1, le=8192)
    converged_below: float = Field(
        default=0.25, gt=0, description="median final relative distance that counts as converged"
    )
    accept_unconverged: bool = Field(
        default=False,
        description="false: a verdict whose figure rests on IRIs whose median stayed at or "
        "above converged_below is withheld (no verdict, the points named); true: the verdict "
        "is given anyway, with a caveat. Does not change the IRIs",
    )
    precision: IRIPrecision = Field(
        default="fp32",
        description="the arithmetic of the IRI steps on a GPU: fp32 (as the paper runs; the "
        "default) or bf16 (autocast: faster, not yet shown to give equal figures). The CPU "
        "always runs fp32",
    )

    @model_validator(mode="before")
    @classmethod
    def _method_preset(cls, data: Any) -> Any:
        """The method's preset under the fields the spec sets. An unknown method is left to
        the field's own check, which names the allowed values."""
        if not isinstance(data, dict):
            return data
        method = data.get("method", catalogue.IRI_METHODS.one(default=True))
        entry = catalogue.IRI_METHODS.get(method) if isinstance(method, str) else None
        return data if entry is None else {**entry.settings, **data}

    def overrides(self, resolution: str | None = None) -> dict[str, Any]:
        """The preset fields whose value is not the method's: what the spec changed. Given
        the resolution the settings were resolved at, a field the preset leaves to it is
        compared with the resolution's value."""
        preset = catalogue.IRI_METHODS[self.method].settings
        if resolution is not None and preset["step_size"] is None:
            preset = {**preset, "step_size": catalogue.RESOLUTIONS[resolution].iri_step_size}
        return {k: getattr(self, k) for k, v in preset.items() if getattr(self, k) != v}

    def described(self, resolution: str | None = None) -> str:
        """'paper' or 'paper (steps 50)': the method and what the spec changed of it."""
        changed = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in self.overrides(resolution).items())
        return f"{self.method} ({changed})" if changed else self.method

    def at(self, resolution: str) -> IRISettings:
        """The settings with the fields left to the input resolution (step_size) filled from
        its preset (catalogue.RESOLUTIONS); a value the spec set stays."""
        if self.step_size is not None:
            return self
        return self.model_copy(
            update={"step_size": catalogue.RESOLUTIONS[resolution].iri_step_size})

    @property
    def max_steps(self) -> int:
        """The most steps one sample can take: the first round and every extra round."""
        return sum(self.round_lengths())

    def round_lengths(self) -> list[int]:
        """The first round, then each extra round: extra_round_steps (else the first round's
        steps x extra_round_growth), each extra_round_growth times the one before."""
        first_extra = (self.extra_round_steps if self.extra_round_steps is not None
                       else self.steps * self.extra_round_growth)
        return [self.steps, *(first_extra * self.extra_round_growth**r
                              for r in range(self.extra_rounds))]

    @model_validator(mode="after")
    def _bounded_cap(self) -> IRISettings:
        if self.max_steps > MAX_IRI_STEPS:
            raise ValueError(
                f"the rounds (steps, then extra_rounds more of extra_round_steps, each "
                f"extra_round_growth times the last) make {self.max_steps} steps per sample; at "
                f"most {MAX_IRI_STEPS}: lower iri.steps, iri.extra_round_steps or "
                f"iri.extra_rounds"
            )
        return self


class ControlSettings(StrictModel):
    noise_sigmas: list[Annotated[float, Field(ge=0, le=10)]] = Field(
        default=[0.1, 0.3], min_length=1, max_length=10)
    shortcut_marker: int = Field(default=4, ge=1, le=32, description="marker side in pixels")
    cues: list[Cue] = Field(
        default=list(catalogue.CUES.names), min_length=1,
        description="unseen cues the shortcut control paints: " + catalogue.CUES.describe(),
    )


class AdversarialSettings(StrictModel):
    """PGD L-inf in [0,1] pixel units (each model's preprocessing applies after it), as in the
    invariance-aware paper's code: 10 steps, no random start, in stitch training, epsilon and
    step from the input resolution unless the spec sets them (catalogue.RESOLUTIONS: 8/255
    and 2/255 at 32 px; 4.30/255 and 1.08/255 at 224 px); the robust evaluation runs `attack`
    (by default AutoAttack's APGD-CE + APGD-DLR as the paper's code runs them) at the same
    epsilon and step, as the paper's configs do at 32 and at 224 px."""

    epsilon: float | None = Field(
        default=None, gt=0, le=1,
        description="the training PGD's epsilon in [0,1] pixels; null: from the input "
        "resolution (8/255 at 32 px, 4.30/255 at 224 px; the report's adversarial_settings "
        "gives the one that ran)")
    step_size: float | None = Field(
        default=None, gt=0, le=1,
        description="PGD's step (training, and attack: pgd) in [0,1] pixels; null: from the "
        "input resolution (2/255 at 32 px, 1.08/255 at 224 px)")
    steps: int = Field(default=10, ge=0, le=200, description="PGD steps in stitch training")
    random_start: bool = False
    alpha: float = Field(
        default=1.0, ge=0, le=1,
        description="adversarial protocols: the fraction of each stitch-training batch "
        "replaced by PGD inputs crafted against the stitched model (the paper's stitching "
        "experiment runs 0 and 1; 0.5 is its ratio for training base models)",
    )
    alphas: Unique[Annotated[float, Field(ge=0, le=1)]] | None = Field(
        default=None, min_length=1, max_length=5,
        description="several alphas in one job (e.g. [0, 1]: alpha 0 is the clean arm); each "
        "adversarial protocol runs once per alpha and its rows carry their alpha; unset: "
        "[alpha]",
    )
    evaluate: bool = Field(
        default=False,
        description="also evaluate every row on test inputs crafted by `attack` against the "
        "stitched model (robust agreement beside the clean one, and how often the attack "
        "fools the back model: its transfer rate)",
    )
    attack: Attack = Field(
        default=catalogue.ATTACKS.one(default=True),
        description="the robust evaluation's attack: " + catalogue.ATTACKS.describe(),
    )
    eval_steps: int | None = Field(
        default=None, ge=1, le=500,
        description="the evaluation attack's iterations (each loss's, for the APGD attacks); "
        "unset: the attack's own default (autoattack_paper and apgd 20, as the paper; pgd 10)",
    )
    eval_epsilon: float | None = Field(
        default=None, gt=0, le=1,
        description="the evaluation attack's epsilon in [0,1] pixels; unset: `epsilon` (the "
        "paper evaluates at its training epsilon: 8/255 at 32 px, 4.30/255 at 224 px)",
    )
    eval_step_size: float | None = Field(
        default=None, gt=0, le=1,
        description="the evaluation attack's step in [0,1] pixels (autoattack_paper's first "
        "step, ART's eps_step; pgd's step; apgd's first step is 2 epsilon whatever this "
        "says); unset: `step_size` (the paper's eps_step is its training step: 2/255 at 32 "
        "px, 1.08/255 at 224 px)",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1)

    def alpha_list(self) -> list[float]:
        """The alphas each adversarial protocol runs at, smallest first: the last (the most
        attacked arm) is the one the summary and the plots read."""
        return sorted(self.alphas) if self.alphas is not None else [self.alpha]

    def attack_steps(self) -> int:
        return self.eval_steps or catalogue.ATTACKS[self.attack].steps

    def attack_epsilon(self) -> float:
        return self.eval_epsilon or self.pgd_epsilon()

    def attack_step_size(self) -> float | None:
        """The evaluation attack's (first) step; None for an attack whose step follows from
        epsilon (apgd)."""
        if not catalogue.ATTACKS[self.attack].step_size:
            return None
        return self.eval_step_size or self.pgd_step_size()

    def pgd_epsilon(self) -> float:
        """The training PGD's epsilon, once resolved (`at`)."""
        assert self.epsilon is not None, "adversarial settings not resolved: call at()"
        return self.epsilon

    def pgd_step_size(self) -> float:
        assert self.step_size is not None, "adversarial settings not resolved: call at()"
        return self.step_size

    def at(self, resolution: str) -> AdversarialSettings:
        """The settings with the fields left to the input resolution (epsilon, step_size)
        filled from its preset (catalogue.RESOLUTIONS); a value the spec set stays. The
        evaluation's unset eval_epsilon and eval_step_size stay unset: they follow these."""
        preset = catalogue.RESOLUTIONS[resolution].adversarial
        return self.model_copy(update={k: v for k, v in preset.items()
                                       if getattr(self, k) is None})


class MeasureSettings(StrictModel):
    """How the representation similarity measures are computed."""

    batch_size: int = Field(
        default=256, ge=16, le=8192,
        description="samples per mini-batch: CKA accumulates unbiased HSIC over them, k-NN "
        "finds neighbours within them, so memory stays bounded on large test sets",
    )
    knn_k: int = Field(default=10, ge=1, le=100, description="neighbours for mutual_knn")
    iri_split: Literal["train", "test"] = Field(
        default="train",
        description="whose IRIs the iri-input measures read: train reuses the IRIs the "
        "invariance-aware protocol synthesises (no extra synthesis); test synthesises IRIs of "
        "the test split (as the invariance-aware paper does; an extra IRI run, cached)",
    )


FulaPoints = Literal["blocks", "stages"]


class FulaSettings(StrictModel):
    """Where functional latent alignment (fula) sets the stitched model against the back
    model after the stitch point."""

    points: FulaPoints = Field(
        default="blocks",
        description="blocks: at every block output after the stitch up to the last block, as "
        "the invariance-aware paper's FuLA does (9 points on ResNet-18: the stem and 8 basic "
        "blocks); stages: at every stage output only (timm's feature_info; fewer terms, "
        "cheaper)",
    )
