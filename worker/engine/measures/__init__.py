"""Figures: the metric definitions (metrics.py), the summary and verdict (summary.py), and the
representation similarity measures beside stitching (similarity.py, one module a measure,
run in a job by in_job.py). Importing this package registers every measure."""

from stitchsim_worker.engine.measures import cka, knn

__all__ = ["cka", "knn"]
