"""The spec check at submission: everything that can fail on the user's side before a worker
spends time on the job, cheaply enough that the run need not trust it.

Models are built on the meta device (no memory for parameters, no weights read: the
checkpoint's header gives its keys and shapes), a meta forward pass gives the stitch points
and their shapes, and uploaded datasets are read as far as their labels. The run prepares the
job for real once; the check's work costs a fraction of a second per model.
"""

from __future__ import annotations

import torch
from stitchsim.models import Spec
from stitchsim_worker.engine.data import Dataset, load_dataset
from stitchsim_worker.engine.device import pick_device
from stitchsim_worker.engine.errors import SpecError
from stitchsim_worker.engine.models import LoadedModel, meta_model
from stitchsim_worker.engine.network import Network
from stitchsim_worker.engine.plan import job_units, what_to_shrink
from stitchsim_worker.engine.preparation import (
    check_classes,
    check_protocols,
    pair_points_of,
)
from stitchsim_worker.engine.resources import Resources

META = torch.device("meta")


def _check_size(model: LoadedModel, where: str, limit: int | None) -> None:
    """Counted on the meta device, so a spec asking for a billion-class head costs nothing to
    refuse."""
    n = sum(p.numel() for p in model.net.parameters())
    if limit is not None and n > limit:
        raise SpecError(f"{where}: {model.arch} with arch_kwargs {model.arch_kwargs} has {n:,} "
                        f"parameters, more than the {limit:,} this service builds "
                        "(STITCHSIM_MAX_MODEL_PARAMS); use a smaller architecture or smaller "
                        "arch_kwargs (num_classes, embed_dim, depth ...)",
                        code="model_too_large", details={"parameters": n, "limit": limit})


def _network(spec: Spec, where: str, resources: Resources, data: Dataset) -> Network:
    ref = getattr(spec, where)
    path, _ = resources.checkpoint(ref.checkpoint)
    model: LoadedModel = meta_model(ref, path, where=where, native_size=data.image_size)
    _check_size(model, where, resources.max_model_params)
    check_classes(model, data, where)
    return Network(model, data.image_size, META, where)


def check_spec(spec: Spec, *, resources: Resources) -> None:
    """Raises SpecError with what to fix; returns when the job can be prepared."""
    pick_device(spec.device)  # checks workers run beside the job workers, on hosts alike
    data = load_dataset(spec.dataset, resources, spec.train)
    front_data = None
    if spec.front_dataset is not None:  # cross-task pairing: the front model's own task
        front_data = load_dataset(spec.front_dataset, resources, spec.train)
    check_protocols(spec, data, front_data)
    front = _network(spec, "front", resources, front_data or data)
    back = _network(spec, "back", resources, data)
    pairs = pair_points_of(spec, front, back)
    if not pairs:
        raise SpecError("no stitch points could be paired between the two models",
                        code="unknown_layer")
    _check_budget(spec, len(data.train), len(data.test), len(pairs), resources.max_job_units)


def _check_budget(spec: Spec, n_tr: int, n_te: int, n_pairs: int, limit: int | None) -> None:
    """The job's work, counted as its progress plan will count it, against the per-job limit."""
    units = job_units(spec, n_tr, n_te, n_pairs)
    if limit is None or units <= limit:
        return
    shrink = what_to_shrink(spec, n_pairs)
    raise SpecError(
        f"the job would take {units:,} work units (about one batch through a network part "
        f"each), more than the {limit:,} this service allows per job (STITCHSIM_MAX_JOB_UNITS); "
        f"shrink {', '.join(shrink[:4]) or 'the dataset or the stitch points'}",
        code="job_too_large",
        details={"units": units, "limit": limit, "shrink": shrink,
                 "n_train": n_tr, "n_test": n_te, "stitch_pairs": n_pairs})
