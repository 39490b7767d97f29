"""Figures on tensors, knowing no model or job: the metric definitions (metrics.py), the output
kinds and how each is scored (outputs.py), the summary and verdict (summary.py), the pseudo
classes of unlabelled outputs (pseudo.py), and the representation similarity measures beside
stitching (similarity.py, one module a measure, run in a job by job/measuring.py). Importing
this package imports every module of it (each measure's registers it) and puts the measures in
the catalogue's order."""

from stitchsim import catalogue
from stitchsim_worker.engine.core.registry import register_package
from stitchsim_worker.engine.measures.similarity import MEASURE_IMPLS

register_package(__name__, __path__, MEASURE_IMPLS, catalogue.MEASURES.names)
