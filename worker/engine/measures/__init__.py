"""Figures on tensors, knowing no model or job: the metric definitions (metrics.py), the output
kinds and how each is scored (outputs.py), the summary and verdict (summary.py), the pseudo
classes of unlabelled outputs (pseudo.py), and the representation similarity measures beside
stitching (similarity.py, one module a measure, run in a job by job/measuring.py). Importing
this package registers every measure."""

from stitchsim_worker.engine.measures import cka, knn

__all__ = ["cka", "knn"]
