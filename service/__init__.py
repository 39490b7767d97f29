"""stitchsim gateway: HTTP API, content-addressed store, job table. Never imports torch or the
worker: jobs are enqueued by task name."""
