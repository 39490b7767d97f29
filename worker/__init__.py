"""stitchsim worker: the Celery app, its thin tasks, the compute engine and `stitchsim-server`."""
