"""What a user may choose when packing: the validated options of `stitchsim dataset pack`,
`stitchsim check --pack KEY=VALUE` and `Client.upload_dataset(path, options)`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stitchsim.catalogue import DATASET_FORMATS
from stitchsim.files.limits import MAX_IMAGE_SIDE

DEFAULT_TEST_FRACTION = 0.2
DEFAULT_SEED = 0
_SIZE = re.compile(r"^\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?$")


class PackOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str | None = Field(
        default=None, description="a dataset format by name (" + ", ".join(DATASET_FORMATS.names)
        + "); default: told from the source's name and content")
    test: Path | None = Field(
        default=None, description="a second source holding the test split (same rules)")
    size: tuple[int, int] | None = Field(
        default=None, description="H x W every image is brought to (\"64\" = 64 x 64, "
        "\"48x64\" = 48 high, 64 wide); default: the most common size found")
    test_fraction: float = Field(
        default=DEFAULT_TEST_FRACTION, gt=0, lt=1, description="share of the training split "
        "made the test split when the source has none")
    seed: int = Field(default=DEFAULT_SEED, ge=0, description="seed of that split and of the "
                      "order of each split")
    unlabelled: bool = Field(default=False, description="store the images without labels "
                             "(a job refuses them where a figure needs labels)")
    image_column: str | None = Field(default=None, description="parquet: the image column")
    label_column: str | None = Field(default=None, description="parquet: the label column")

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        if value is not None and value not in DATASET_FORMATS:
            raise ValueError(f"unknown dataset format {value!r}; one of: "
                             + ", ".join(DATASET_FORMATS.names))
        return value

    @field_validator("size", mode="before")
    @classmethod
    def _parse_size(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value, value)
        elif isinstance(value, str):
            m = _SIZE.match(value)
            if not m:
                raise ValueError(f"size {value!r} is not N or HxW (e.g. 64 or 48x64)")
            h = int(m.group(1))
            value = (h, int(m.group(2)) if m.group(2) else h)
        return value

    @field_validator("size")
    @classmethod
    def _size_in_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not all(1 <= s <= MAX_IMAGE_SIDE for s in value):
            raise ValueError(f"size {value[0]}x{value[1]}: sides must lie in 1..{MAX_IMAGE_SIDE}")
        return value
