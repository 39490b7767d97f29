"""stitchsim service, in two layers:

    core/      settings, job table and job state machine, store, quotas, object bookkeeping,
               API keys, the reaper, Celery configuration and the queue client, the submit
               workflow; no HTTP, no torch; raises the contract's Failure (a registry code)
    gateway/   the FastAPI app on top: routers that translate HTTP, uploads, pages, and the one
               place that maps failures to HTTP statuses

Nothing here imports worker code: jobs are enqueued by task name, so the gateway image needs
no torch; and nothing in core imports the gateway, so workers never load FastAPI.
"""
