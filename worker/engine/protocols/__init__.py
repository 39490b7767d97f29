"""The protocols and the controls: what the stitch is trained on, and fitting it per protocol
(fitting.py). The attacks they use are the models' (models/attacks.py).

Each protocol module registers its implementation on import; importing this package imports
every module of it and puts the protocols in the catalogue's order.
"""

from stitchsim import catalogue
from stitchsim_worker.engine.core.registry import register_package
from stitchsim_worker.engine.protocols.entry import (
    PROTOCOL_IMPLS,
    ProtocolImpl,
    register_protocol,
    stitched,
)

register_package(__name__, __path__, PROTOCOL_IMPLS, catalogue.PROTOCOLS.names)

__all__ = ["PROTOCOL_IMPLS", "ProtocolImpl", "register_protocol", "stitched"]
