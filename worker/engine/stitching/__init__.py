"""The stitch layer T, what it is trained on, the objectives and the fitting loop."""
