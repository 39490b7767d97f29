"""Datasets: the built-in sets and uploaded files, in [0,1] RGB pixel space."""
