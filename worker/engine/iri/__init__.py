"""Indistinguishable representation inputs: synthesis (synthesis.py) and how a step runs on the
CPU (kernels.py); their cache is a kind of the reference cache (core/iri_cache.py)."""
