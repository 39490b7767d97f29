"""The service's core: everything about jobs, objects and keys that is not HTTP.

Imported by the gateway (which translates it to HTTP) and by the workers (which run the jobs).
It imports neither FastAPI/Starlette nor torch, and refuses what it cannot do with a
Failure (stitchsim.failure) carrying a code of the registry (stitchsim.codes).
"""
