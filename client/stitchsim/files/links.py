"""Which files of a local folder may be read: symbolic links are followed only while they stay
inside the folder (a cloned model repository or a dataset folder can ship a link to
/etc/passwd or ~/.ssh, whose text would otherwise be uploaded and stored; docs/client.md).

The one exception is the Hugging Face cache, whose snapshot folders are made of links:
`models--org--name/snapshots/<rev>/config.json -> ../../blobs/<hash>`. A folder inside a cache
repository's `snapshots/` may follow links anywhere inside that repository's folder, and
nowhere else. Model folders (stitchsim.files.folder) and dataset folders
(stitchsim.packing.archives.DirTree) both ask `check_inside`; archives refuse links outright.

Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--")
"""How the Hugging Face cache names a repository's folder (huggingface_hub's repo_folder_name)."""


class LinkOutside(ValueError):
    """A link that leads outside the folder it was found in; the message says where to."""


def boundary(root: str | os.PathLike[str]) -> Path:
    """The real folder links under `root` must stay in: the cache repository's folder when
    `root` is one of its snapshots, else `root` itself (its real path)."""
    real = Path(root).resolve()
    for parent in real.parents:
        if parent.name.startswith(HF_REPO_PREFIXES) and real.is_relative_to(parent / "snapshots"):
            return parent
    return real


def check_inside(path: Path, root: Path, *, within: Path | None = None) -> None:
    """Raise LinkOutside when `path` (a file found under `root`) is a
    link whose target lies outside `within` (default: boundary(root)); a dangling link is
    refused too. Callers list files without following links to folders (os.walk's default),
    so only the file itself can be a link: a plain file costs one lstat."""
    if not path.is_symlink():
        return
    limit = within if within is not None else boundary(root)
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop
        raise LinkOutside(f"{_rel(path, root)} is a broken symbolic link "
                          f"(to {os.readlink(path) if path.is_symlink() else '?'})") from None
    if not real.is_relative_to(limit):
        raise LinkOutside(
            f"{_rel(path, root)} is a symbolic link to {real}, outside the folder {root}; "
            "refusing to read it (a link may only point inside the folder, or inside the "
            "Hugging Face cache repository the folder is a snapshot of). Copy the file in "
            "if it is meant to be part of the folder")


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


__all__ = ["HF_REPO_PREFIXES", "LinkOutside", "boundary", "check_inside"]
