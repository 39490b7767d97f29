"""The protocols and the controls: what the stitch is trained on, and fitting it per protocol
(fitting.py). The attacks they use are the models' (models/attacks.py).

Each protocol module registers its entry on import; importing this package registers them all.
"""

# isort: off
# Registration order is the catalogue's (tests/engine/test_registries.py holds the two).
from stitchsim_worker.engine.protocols import standard, invariance_aware, adversarial, cross_task
# isort: on
from stitchsim_worker.engine.protocols.entry import (
    PROTOCOL_IMPLS,
    ProtocolImpl,
    register_protocol,
    stitched,
)

__all__ = ["PROTOCOL_IMPLS", "ProtocolImpl", "register_protocol", "stitched", "adversarial",
           "cross_task", "invariance_aware", "standard"]
