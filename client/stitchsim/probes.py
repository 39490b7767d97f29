"""The built-in probe sets (spec.probes): inputs where a latent shortcut of the built-in data
would show. The engine makes them from the clean digits' own splits (the same digits, in the
same order), painting the digits_marker dataset's class-coloured marker with the class that
each recipe names instead of the digit's own; the labels stay the digits'. A model that reads
the digit keeps its accuracy on them, one that reads the marker follows the marker.

Any dataset the service takes is a probe too (spec.probes); these need no upload."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuiltinProbe:
    name: str
    description: str
    base: str = "digits"
    """The built-in dataset whose images it marks."""


BUILTIN_PROBES: dict[str, BuiltinProbe] = {
    p.name: p
    for p in (
        BuiltinProbe("digits_marker_conflict",
                     "grey digits, each with the marker of another class (one drawn at random "
                     "from the nine others, seeded): a cue-conflict set, on which a model "
                     "reading the marker and one reading the digit disagree"),
        BuiltinProbe("digits_marker_swapped",
                     "grey digits with the marker of the next class (markers rolled by one "
                     "class): a fixed, systematic conflict"),
    )
}
