"""Named entries, registered once, as timm registers its models: the objectives, protocols,
controls and cues of the engine are each one registry of these."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


class Registry(dict[str, E]):
    """Entries by name; registering a name twice is a bug of ours, found at import."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, entry: E) -> E:
        if entry.name in self:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self[entry.name] = entry
        return entry

    def order_by(self, names: Iterable[str]) -> None:
        """Puts the entries in this order (the catalogue's); any others keep theirs, after."""
        entries = dict(self)
        self.clear()
        for name in [n for n in names if n in entries] + list(entries):
            if name not in self:
                self[name] = entries[name]


def register_package(package: str, path: Sequence[str], registry: Registry[E],
                     order: Iterable[str]) -> None:
    """Imports every module of a package, each registering its entries on import (found, not
    listed: a new module is one file), then orders the registry as the catalogue does."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
    registry.order_by(order)


def check_flag(kind: str, name: str, flag: str, stated: bool, does: bool, behaviour: str
               ) -> None:
    """A catalogue flag of an entry held against what its engine implementation does (the
    flag is what the client, the check and the report read; the implementation is what runs):
    where they disagree, one of them is a bug of ours, found at import."""
    if stated != does:
        raise ValueError(f"{kind} {name!r}: its catalogue entry says {flag}={stated}, but for "
                         f"its implementation '{behaviour}' is {does}")
