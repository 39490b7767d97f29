"""Model folders with no flags (issue 28): a folder as save_pretrained or timm's hub layout
writes it is packed into one file (every shard's tensors, the config files in its metadata)
and uploaded whole; a config the service refuses, or half a folder, fails here first, naming
the file, the field and the fix, with nothing sent. Standard library files only."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from stitchsim import Client
from stitchsim.errors import InvalidFile
from stitchsim.files.folder import InvalidModelFolder, pack_model_folder
from stitchsim.files.header import read_header
from stitchsim.files.model_config import MAX_CONFIG_BYTES, InvalidModelConfig

from tests.client.fake_service import FakeService
from tests.client.files import write_safetensors

HF = {"model_type": "vit", "architectures": ["ViTForImageClassification"], "num_labels": 10}
TIMM = {"architecture": "resnet18", "num_classes": 10,
        "pretrained_cfg": {"mean": [0.3, 0.3, 0.3], "std": [0.2, 0.2, 0.2],
                           "input_size": [3, 32, 32]}}


def _folder(tmp: Path, config: object, *, name: str = "model") -> Path:
    folder = tmp / name
    folder.mkdir()
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text)
    write_safetensors(folder / "model.safetensors", b"weights" * 8, metadata={"format": "pt"})
    return folder


def _sharded(tmp: Path) -> Path:
    folder = tmp / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF))
    for k, data in enumerate((b"first shard!", b"second")):
        shard = folder / f"model-0000{k + 1}-of-00002.safetensors"
        header = {f"w{k}xxxx": {"dtype": "U8", "shape": [len(data)],
                                "data_offsets": [0, len(data)]}}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    index = {"metadata": {}, "weight_map": {"w0xxxx": "model-00001-of-00002.safetensors",
                                            "w1xxxx": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_a_transformers_folder_packs_into_one_file_carrying_its_config(tmp_path: Path) -> None:
    folder = _folder(tmp_path, HF)
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3,
                                                                "image_std": [0.5] * 3}))
    packed = pack_model_folder(folder, tmp_path / "a.safetensors")
    header = read_header(packed.path)
    assert header.metadata["arch"] == "transformers:ViTForImageClassification"
    assert json.loads(header.metadata["config.json"]) == HF
    assert "preprocessor_config.json" in header.metadata
    assert header.metadata["format"] == "pt"  # the shard's own metadata stays
    assert packed.config.preprocess.mean == (0.5, 0.5, 0.5)
    # The same folder packs to the same bytes: stored once however often it is uploaded.
    again = pack_model_folder(folder, tmp_path / "b.safetensors")
    assert packed.path.read_bytes() == again.path.read_bytes()


def test_a_timm_hub_folder_gives_arch_kwargs_and_preprocessing(tmp_path: Path) -> None:
    packed = pack_model_folder(_folder(tmp_path, TIMM), tmp_path / "t.safetensors")
    meta = read_header(packed.path).metadata
    assert meta["arch"] == "resnet18"
    assert json.loads(meta["arch_kwargs"]) == {"num_classes": 10}
    assert packed.config.preprocess.mean == (0.3, 0.3, 0.3)
    assert packed.config.summary()["layout"] == "timm"


def test_sharded_weights_are_merged_tensor_for_tensor(tmp_path: Path) -> None:
    packed = pack_model_folder(_sharded(tmp_path), tmp_path / "s.safetensors")
    header = read_header(packed.path)
    data = packed.path.read_bytes()
    got = {n: data[t.start:t.end] for n, t in header.tensors.items()}
    assert got == {"w0xxxx": b"first shard!", "w1xxxx": b"second"}
    assert packed.shards == 2


@pytest.mark.parametrize("config, words", [
    ({**HF, "auto_map": {"AutoModel": "modeling_evil.Evil"}}, "field 'auto_map'"),
    ({**HF, "trust_remote_code": True}, "field 'trust_remote_code'"),
    ("{model_type: vit", "config.json is not valid JSON"),
    ([1, 2], "must hold a JSON object"),
    ({**HF, "pad": "x" * (MAX_CONFIG_BYTES + 1)}, "more than the"),
    ({"hidden_size": 3}, "names no architecture"),
    ({"model_type": "vit"}, "field 'architectures' must list the model class"),
])
def test_a_config_the_service_would_refuse_fails_before_anything_is_written(
    tmp_path: Path, config: object, words: str
) -> None:
    out = tmp_path / "out.safetensors"
    with pytest.raises((InvalidModelConfig, InvalidModelFolder)) as info:
        pack_model_folder(_folder(tmp_path, config), out)
    assert words in info.value.message
    assert "config.json" in info.value.message
    assert info.value.code in ("invalid_model_config", "invalid_model_folder")
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_half_a_folder_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    folder = _sharded(tmp_path)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InvalidModelFolder, match="lists model-00002-of-00002.safetensors, "
                                                 "which is not in"):
        pack_model_folder(folder, tmp_path / "x.safetensors")
    bare = tmp_path / "bare"
    bare.mkdir()
    write_safetensors(bare / "model.safetensors", b"w")
    with pytest.raises(InvalidModelFolder, match="has no config.json"):
        pack_model_folder(bare, tmp_path / "y.safetensors")
    pickled = _folder(tmp_path, HF, name="pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(InvalidModelFolder, match="a pickle this service never loads"):
        pack_model_folder(pickled, tmp_path / "z.safetensors")


def test_the_sdk_uploads_a_folder_as_one_file_and_refuses_a_bad_one_unsent(
    fake: FakeService, tmp_path: Path
) -> None:
    with Client(fake.url) as client:
        stored = client.upload_checkpoint(_folder(tmp_path, HF))
        posts = fake.calls("POST", "/checkpoints")
        assert len(posts) == 1 and b"ViTForImageClassification" in posts[0].body
        assert stored.id.startswith("sha256:")
        bad = _folder(tmp_path, {**HF, "auto_map": {}}, name="bad")
        with pytest.raises(InvalidFile) as info:
            client.upload_checkpoint(bad)
    assert info.value.code == "invalid_model_config" and "auto_map" in str(info.value)
    assert len(fake.calls("POST", "/checkpoints")) == 1


def test_a_file_carrying_a_refused_config_is_refused_by_the_header_check(tmp_path: Path
                                                                         ) -> None:
    # The gateway and the engine run the same header check on every upload.
    path = write_safetensors(tmp_path / "m.safetensors", b"w",
                             metadata={"config.json": json.dumps({**HF, "auto_map": {}})})
    with pytest.raises(InvalidModelConfig, match="auto_map"):
        read_header(path)
