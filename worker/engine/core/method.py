"""The engine's method version: what a report's figures were made with.

Bump METHOD_VERSION with any change of the engine that moves figures under the same spec (a new
IRI default schedule, another metric's formula, a fix that changes a stitch's training). A CI
baseline recorded under another version is refused by `stitchsim check --baseline` until it
is recomputed, so a service upgrade cannot flip a gate with no change of the model.
"""

from __future__ import annotations

from stitchsim.method import method_settings
from stitchsim.models import MethodRecord, Spec

METHOD_VERSION = "2026.12.2"  # .2: the paper IRI method finishes (issue 36)


def method_record(spec: Spec) -> MethodRecord:
    return MethodRecord(engine=METHOD_VERSION, settings=method_settings(spec))
