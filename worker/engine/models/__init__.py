"""Models: loading checkpoints, preprocessing, cutting a network at stitch points, the layout
of a point's representation (rep.py), attacks on a model's inputs (attacks.py), the built-in
reference models."""
