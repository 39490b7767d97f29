"""Files of a dataset source read safely: a directory, a zip or a tar (plain or compressed).

Nothing is ever extracted to disk; members are read into memory one at a time. Still, an
archive from elsewhere is refused, before a member is read, when a member's path is absolute
or climbs out of the archive's root (`../`), when it is a link (symbolic or hard) or a device,
when two members share a name, and when it is a decompression bomb: more than
`MAX_TOTAL_BYTES` unpacked, more than `MAX_MEMBERS` members, or, beyond `BOMB_FLOOR_BYTES`, a
member or the whole archive unpacking to more than `MAX_RATIO` times its compressed size
(images hardly compress, so a real dataset stays far below it).
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from stitchsim.errors import DatasetSourceError
from stitchsim.files.links import LinkOutside, boundary, check_inside

MAX_TOTAL_BYTES = 64 * 1024**3
MAX_MEMBERS = 10_000_000
MAX_RATIO = 100.0
BOMB_FLOOR_BYTES = 64 * 1024**2
"""Below this, a high ratio is harmless (a small text file compresses 100x too)."""
MAX_FILE_BYTES = 512 * 1024**2
"""One image file (or label) read into memory at a time, at most this big."""

ZIP_SUFFIXES = (".zip",)
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def hidden(rel: str) -> bool:
    """Files no dataset means: dot files and folders (.DS_Store, .ipynb_checkpoints) and the
    resource forks macOS puts into zips (__MACOSX/)."""
    return any(p.startswith(".") or p == "__MACOSX" for p in PurePosixPath(rel).parts)


class Tree(ABC):
    """The regular files of a source, by relative POSIX path, read in one fixed order."""

    def __init__(self, path: Path):
        self.path = path

    @abstractmethod
    def files(self) -> list[str]:
        """Every regular file's relative path, in the order `read` yields them."""

    @abstractmethod
    def read(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        """(path, bytes) of the wanted files, in `files()` order."""

    def folders(self) -> set[str]:
        """Every folder's relative path, empty ones included where the source records them
        (a directory always; an archive's own folder entries), so an empty class folder can
        be named rather than silently missing."""
        out = set(self._folder_entries())
        for rel in self.files():
            parts = PurePosixPath(rel).parts[:-1]
            out.update("/".join(parts[:k]) for k in range(1, len(parts) + 1))
        return out

    def _folder_entries(self) -> list[str]:
        return []

    def error(self, message: str) -> DatasetSourceError:
        return DatasetSourceError(f"{self.path}: {message}")


def open_tree(path: Path) -> Tree:
    if path.is_dir():
        return DirTree(path)
    name = path.name.lower()
    if name.endswith(ZIP_SUFFIXES):
        return ZipTree(path)
    if name.endswith(TAR_SUFFIXES):
        return TarTree(path)
    raise DatasetSourceError(f"{path}: not a directory, zip or tar archive")


def _read_capped(fh: object, where: str, tree: Tree) -> bytes:
    data = fh.read(MAX_FILE_BYTES + 1)  # type: ignore[attr-defined]
    if len(data) > MAX_FILE_BYTES:
        raise tree.error(f"{where} is larger than {MAX_FILE_BYTES} bytes; not an image file")
    return bytes(data)


class DirTree(Tree):
    """A folder: links are followed only while they stay inside it (stitchsim.files.links),
    as a model folder's are; links to folders are not walked (os.walk's default)."""

    def files(self) -> list[str]:
        out = []
        within = boundary(self.path)
        self._dirs: list[str] = []
        for root, dirs, names in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            rel_root = Path(root).relative_to(self.path)
            for d in dirs:
                try:  # a link to a folder is not walked, but one leading out is refused
                    check_inside(Path(root) / d, self.path, within=within)
                except LinkOutside as exc:
                    raise self.error(str(exc)) from None
            self._dirs.extend((rel_root / d).as_posix() for d in dirs
                              if not (Path(root) / d).is_symlink())
            for name in sorted(names):
                full = Path(root) / name
                try:
                    if not name.startswith("."):  # dot files are never read
                        check_inside(full, self.path, within=within)
                except LinkOutside as exc:
                    raise self.error(str(exc)) from None
                if full.is_file():
                    out.append((rel_root / name).as_posix())
        return out

    def _folder_entries(self) -> list[str]:
        if not hasattr(self, "_dirs"):
            self.files()
        return self._dirs

    def read(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        for rel in self.files():
            if rel in wanted:
                try:
                    with open(self.path / rel, "rb") as fh:
                        yield rel, _read_capped(fh, rel, self)
                except OSError as exc:
                    raise self.error(f"cannot read {rel}: {exc.strerror}") from None


def _safe_name(tree: Tree, name: str) -> str:
    """The member's path relative to the archive's root, or a refusal naming it."""
    posix = name.replace("\\", "/")
    parts = PurePosixPath(posix).parts
    if posix.startswith("/") or (parts and parts[0].endswith(":")) or ".." in parts:
        raise tree.error(
            f"member {name!r} points outside the archive's root; refusing the archive "
            "(make it again from inside the dataset folder, with relative paths)")
    return "/".join(p for p in parts if p not in ("", "."))


def _check_bomb(tree: Tree, what: str, unpacked: int, packed: int) -> None:
    if unpacked > BOMB_FLOOR_BYTES and unpacked > MAX_RATIO * max(packed, 1):
        raise tree.error(
            f"{what} unpacks to {unpacked} bytes from {packed} ({unpacked / max(packed, 1):.0f}"
            f" times), more than the {MAX_RATIO:.0f} times this client accepts: a "
            "decompression bomb, or not a dataset of images")


class _Budget:
    """Counts members and unpacked bytes against the caps, as the listing goes."""

    def __init__(self, tree: Tree):
        self.tree, self.members, self.total = tree, 0, 0
        self.names: set[str] = set()

    def add(self, rel: str, size: int) -> None:
        self.members += 1
        self.total += size
        if self.members > MAX_MEMBERS:
            raise self.tree.error(f"holds more than {MAX_MEMBERS} members")
        if self.total > MAX_TOTAL_BYTES:
            raise self.tree.error(
                f"unpacks to more than {MAX_TOTAL_BYTES} bytes; refusing it (an archive bomb, "
                "or a dataset too large to pack here)")
        if rel in self.names:
            raise self.tree.error(f"holds {rel!r} twice; which one is meant is unclear")
        self.names.add(rel)


class ZipTree(Tree):
    def __init__(self, path: Path):
        super().__init__(path)
        self._members: list[tuple[str, zipfile.ZipInfo]] | None = None

    def _zip(self) -> zipfile.ZipFile:
        try:
            return zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise self.error(f"not a readable zip archive ({exc})") from None

    def _list(self) -> list[tuple[str, zipfile.ZipInfo]]:
        if self._members is not None:
            return self._members
        budget = _Budget(self)
        members = []
        self._dirs: list[str] = []
        with self._zip() as zf:
            for info in zf.infolist():
                rel = _safe_name(self, info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise self.error(f"member {info.filename!r} is a symbolic link; refusing "
                                     "the archive (put the files themselves in it)")
                if info.is_dir() and rel:
                    self._dirs.append(rel)
                if info.is_dir() or not rel:
                    continue
                if info.flag_bits & 0x1:
                    raise self.error(f"member {info.filename!r} is encrypted")
                _check_bomb(self, f"member {info.filename!r}", info.file_size,
                            info.compress_size)
                budget.add(rel, info.file_size)
                members.append((rel, info))
        _check_bomb(self, "the archive", budget.total, self.path.stat().st_size)
        self._members = members
        return members

    def files(self) -> list[str]:
        return [rel for rel, _ in self._list()]

    def _folder_entries(self) -> list[str]:
        self._list()
        return self._dirs

    def read(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        members = self._list()
        with self._zip() as zf:
            for rel, info in members:
                if rel in wanted:
                    try:
                        with zf.open(info) as fh:
                            yield rel, _read_capped(fh, rel, self)
                    except (zipfile.BadZipFile, OSError, EOFError) as exc:
                        raise self.error(f"cannot read member {rel}: {exc}") from None


class TarTree(Tree):
    SUFFIXES = TAR_SUFFIXES

    def __init__(self, path: Path):
        super().__init__(path)
        self._names: list[str] | None = None

    def _open(self) -> tarfile.TarFile:
        try:
            return tarfile.open(self.path, "r:*")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise self.error(f"not a readable tar archive ({exc})") from None

    def _members(self, tf: tarfile.TarFile) -> Iterator[tuple[str, tarfile.TarInfo]]:
        """Regular members as the tar streams by; each checked before its data is passed.
        Folder entries are collected on the way (`_folder_entries`)."""
        self._dirs: list[str] = []
        budget = _Budget(self)
        packed = self.path.stat().st_size
        try:
            for info in tf:
                rel = _safe_name(self, info.name)
                if info.issym() or info.islnk():
                    raise self.error(f"member {info.name!r} is a link; refusing the archive "
                                     "(put the files themselves in it)")
                if info.isdev() or info.isfifo():
                    raise self.error(f"member {info.name!r} is a device or pipe")
                if info.isdir() and rel:
                    self._dirs.append(rel)
                if not info.isfile() or not rel:
                    continue
                budget.add(rel, info.size)
                _check_bomb(self, "the archive", budget.total, packed)
                yield rel, info
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise self.error(f"cannot read the tar archive ({exc})") from None

    def first(self, n: int) -> list[str]:
        """The first n regular files' paths (a cheap look at a large archive)."""
        out: list[str] = []
        with self._open() as tf:
            for rel, _ in self._members(tf):
                out.append(rel)
                if len(out) >= n:
                    break
        return out

    def files(self) -> list[str]:
        if self._names is None:
            with self._open() as tf:
                self._names = [rel for rel, _ in self._members(tf)]
                self._tar_dirs = self._dirs
        return self._names

    def _folder_entries(self) -> list[str]:
        self.files()
        return self._tar_dirs

    def read(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        # In the archive's own order: a compressed tar is only read forwards.
        with self._open() as tf:
            for rel, info in self._members(tf):
                if rel in wanted:
                    fh = tf.extractfile(info)
                    if fh is None:
                        continue
                    try:
                        yield rel, _read_capped(fh, rel, self)
                    except (tarfile.TarError, OSError, EOFError) as exc:
                        raise self.error(f"cannot read member {rel}: {exc}") from None
