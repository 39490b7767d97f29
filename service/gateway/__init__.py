"""The HTTP gateway: `uvicorn --factory stitchsim_service.gateway.main:create_app`.

Routers only translate HTTP to calls of the core and back; `errors` is the one place that
turns a Failure (stitchsim.failure) into a status, by the error-code registry.
"""
