"""The vocabulary a spec and a report are written in: every name a user can write."""

from __future__ import annotations

from typing import Literal, get_args

# The catalogue's names, as the spec and its users know them.
from stitchsim.datasets import BUILTIN_DATASETS as BUILTIN_DATASETS

Objective = Literal["hlm", "slm", "dm", "fula"]
Protocol = Literal["standard", "invariance_aware", "adversarial", "cross_task"]
Direction = Literal["front_to_back", "back_to_front"]
Directions = Literal["front_to_back", "back_to_front", "both"]
Control = Literal["clustered_noise", "identity", "shortcut"]
Measure = Literal["cka", "mutual_knn"]
"""Representation similarity measures beside stitching (no fitting): linear CKA (unbiased,
mini-batch HSIC) and mutual k-nearest-neighbour alignment."""
MeasureInput = Literal["real", "iri"]
"""What the measure's activations are of: real test images, or the front model's IRIs."""
Cue = Literal["pixel_specific", "pixel_rand", "rand_rand"]
"""Unseen cues of the shortcut control: a class-coloured marker at a class-specific place, the
same colours at a random place, random colours at random places (no class information)."""
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Verdict = Literal["similar", "dissimilar"]
Preprocessing = Literal["auto", "timm", "none", "inception"]
"""How pixels in [0,1] reach a model: `timm` normalises with the architecture's pretrained
config (ImageNet mean/std for most), `none` feeds plain [0,1] pixels, `inception` maps them to
[-1,1] (mean = std = 0.5), and `auto` (the default) takes the checkpoint's metadata, else
measures the candidates on labelled samples and keeps the best-predicting one."""
PreprocessSource = Literal["spec", "metadata", "measured", "default"]

# The one ordering of each enumeration (reports, tables and plots list them in this order).
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
CONTROLS: tuple[Control, ...] = get_args(Control)
CUES: tuple[Cue, ...] = get_args(Cue)
MEASURES: tuple[Measure, ...] = get_args(Measure)
MEASURE_INPUTS: tuple[MeasureInput, ...] = get_args(MeasureInput)
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
ACTIVE_STATES: tuple[JobState, ...] = ("queued", "running")
TERMINAL_STATES: tuple[JobState, ...] = tuple(s for s in JOB_STATES if s not in ACTIVE_STATES)
