"""The stitch layer T, what it is trained on (activations), the objectives, the training loop,
and the image grids of stitched outputs. Fitting one per protocol is protocols/fitting.py."""
