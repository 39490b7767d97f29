"""stitchsim client: the contract models, the HTTP SDK and the `stitchsim` CLI."""

from stitchsim.models import Report, Spec

__all__ = ["Report", "Spec"]
__version__ = "0.1.0"
