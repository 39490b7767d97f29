"""The service's resources: job status, progress, errors, stored objects, usage."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from stitchsim.models.spec import (
    Spec,
)
from stitchsim.models.vocabulary import (
    JobState,
)

# ---------------------------------------------------------------- service resources


class Progress(BaseModel):
    stage: str = "queued"
    done: int = 0
    total: int = 0
    eta_s: float | None = None


class ErrorInfo(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorBody(BaseModel):
    error: ErrorInfo


class Estimate(BaseModel):
    """The job's cost as the spec check counted it before the job was queued."""

    units: int = Field(description="work units (about one batch through a network part), as "
                       "the job's progress plan counts them")
    seconds: float | None = Field(default=None, description="expected run time on a worker: "
                                  "units times the service's calibrated seconds per unit")


class JobStatus(BaseModel):
    id: str
    state: JobState
    progress: Progress = Progress()
    estimate: Estimate | None = Field(default=None, description="null when the job was "
                                      "queued unchecked")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = 0
    error: ErrorInfo | None = None
    spec: Spec | None = None
    report_url: str | None = None


class JobList(BaseModel):
    items: list[JobStatus]
    next_cursor: str | None = None


class JobCreated(BaseModel):
    job_id: str
    status_url: str


class StoredObject(BaseModel):
    """An uploaded checkpoint or dataset."""

    id: str = Field(description='"sha256:<hex>" of the file')
    size: int
    n_tensors: int
    arch: str | None = None
    metadata: dict[str, str] = {}


class Usage(BaseModel):
    """What a key uses of its quotas (GET /usage)."""

    active_jobs: int = Field(description="jobs queued or running")
    max_active_jobs: int = Field(description="more submissions are answered 429")
    stored_bytes: int = Field(description="bytes of checkpoints and datasets this key keeps")
    max_stored_bytes: int = Field(description="uploads beyond it are answered 413")
    active_units: int = Field(default=0, description="estimated work units of the jobs "
                              "queued or running (their estimate.units)")
    max_active_units: int | None = Field(default=None, description="submissions that would "
                                         "go beyond it are answered 429; null: no limit")


class DatasetInfo(BaseModel):
    id: str
    builtin: bool
    size: int | None = None
    n_train: int | None = None
    n_test: int | None = None
    image_shape: list[int] | None = None
    n_classes: int | None = None
    description: str = ""
    labelled: bool = True
    """False: stored without labels; jobs whose figures need labels refuse it (422)."""
    test_split: str | None = None
    """How the test split came to be, when the file says (`stitchsim dataset pack` records
    it): given by the source, or made from the training split (fraction, seed)."""
    source_format: str | None = None
    """The dataset format it was packed from (a catalogue name), when the file says."""


class StitchPoint(BaseModel):
    name: str = Field(description="module output, as `layers` names it")
    shape: list[int] = Field(description="one sample's output shape (no batch dimension)")
    stage: bool = Field(default=False, description="a stage output (timm's feature_info)")
    auto: bool = Field(default=False, description='one of the points `layers: "auto"` picks')


class StitchPoints(BaseModel):
    """GET /checkpoints/{id}/points: where a checkpoint's model can be stitched, counted by a
    check worker on the meta device (no weights read)."""

    checkpoint: str
    arch: str
    arch_kwargs: dict[str, Any] = Field(default_factory=dict)
    input_size: int = Field(description="the square input side the shapes are for")
    points: list[StitchPoint] = Field(description="every stitchable module output, in "
                                      "execution order")
    unstitchable: dict[str, str] = Field(default_factory=dict,
                                         description="module outputs that cannot be "
                                         "stitched, and why")

    @property
    def stages(self) -> list[str]:
        return [p.name for p in self.points if p.stage]

    @property
    def auto(self) -> list[str]:
        return [p.name for p in self.points if p.auto]
