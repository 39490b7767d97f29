"""Models: loading checkpoints, preprocessing, cutting a network at stitch points, the
built-in reference models."""
