"""Other formats told apart from a file's first bytes, so a pickle is refused before anything
parses it (a pickle can run code when loaded)."""

from __future__ import annotations

from stitchsim.files.errors import UnsupportedFormat

EXPORT_HINT = (
    "export the weights with safetensors, e.g. "
    "`safetensors.torch.save_file(model.state_dict(), 'model.safetensors')`"
)

DATASET_HINT = (
    "pack it into the service's dataset file with `stitchsim dataset pack SOURCE "
    "OUT.safetensors` (or give it to `stitchsim check --dataset`, which packs it)"
)
_DATASET_WHAT = {
    b"PK\x03\x04": "a zip archive (a zipped image folder, or a NumPy .npz)",
    b"\x1f\x8b": "a gzip file (a .tar.gz of images?)",
}

_MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip archive (PyTorch's torch.save format, which holds a pickle)"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x93NUMPY", "a NumPy .npy file"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras .h5?)"),
    (b"GGUF", "a GGUF file"),
    (b"\x1f\x8b", "a gzip file"),
    (b"\xfd7zXZ", "an xz file"),
    (b"BZh", "a bzip2 file"),
    (b"ustar", "a tar archive"),
    (b"PAR1", "a parquet file"),
)


def sniff(first: bytes, *, dataset: bool = False) -> None:
    """Refuse well-known non-safetensors formats from the first bytes (at least 9 given);
    `dataset`: the file was sent as a dataset, and the hint says how to pack one (a zip, npz
    or parquet is a dataset source the client packs, not a torch.save checkpoint).

    Raises UnsupportedFormat; returns quietly when the bytes may start a safetensors file.
    """
    if dataset:
        _sniff_dataset(first)
    for magic, what in _MAGICS:
        if first.startswith(magic):
            raise UnsupportedFormat(f"this file is {what}, not safetensors; {EXPORT_HINT}")
    # Pickle protocol 2+ starts with PROTO (0x80) and the protocol number; protocol 0/1 pickles
    # start with an opcode such as '(' or ']' or 'c'. None of these can begin a safetensors
    # file, whose first 8 bytes are a header length that is < 2**56 and whose 9th byte is '{'.
    if first[:1] == b"\x80" and first[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise UnsupportedFormat(
            f"this file is a Python pickle, which can run code when loaded; {EXPORT_HINT}"
        )
    if len(first) > 262 and first[257:262] == b"ustar":
        raise UnsupportedFormat(f"this file is a tar archive, not safetensors; {EXPORT_HINT}")
    # Protocol 0/1 pickles start with an opcode; a safetensors file may too (it is the low byte
    # of the header length), but then its 9th byte is '{'.
    if len(first) >= 9 and first[8:9] != b"{" and first[:1] in (b"(", b"]", b"}", b"c", b"q"):
        raise UnsupportedFormat(
            f"this file looks like a Python pickle (protocol 0/1), not safetensors; {EXPORT_HINT}"
        )


def _sniff_dataset(first: bytes) -> None:
    what = next((_DATASET_WHAT.get(magic, w) for magic, w in _MAGICS if first.startswith(magic)),
                None)
    if what is None and len(first) > 262 and first[257:262] == b"ustar":
        what = "a tar archive (an image folder or a WebDataset?)"
    if what is not None:
        raise UnsupportedFormat(f"this file is {what}, not the service's dataset file "
                                f"(safetensors); {DATASET_HINT}")
