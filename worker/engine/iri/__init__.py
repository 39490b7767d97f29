"""Indistinguishable representation inputs: synthesis (synthesis.py), how a step runs on the
CPU (kernels.py), and the content-addressed cache (cache.py)."""
