"""Stitch points from where the check runs: GET /checkpoints/{id}/points answered by the
service's check worker for two architectures (every stitchable module output with its
shape, stage outputs marked, what `layers: "auto"` picks, at the input size asked for), the
SDK's Client.points and `stitchsim points FILE` (which uploads the file), and the 422 for an
unknown point, which names that route with the checkpoint's id."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from stitchsim import Client
from stitchsim.cli import main
from stitchsim.errors import NotFound

from tests.fixtures_service import ServiceHandle
from tests.service.conftest import tiny_spec, upload
from tests.service.helpers import assert_error_body


def _write(path: Path, arch: str, kwargs: dict[str, Any]) -> Path:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model(arch, pretrained=False, **kwargs)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path),
              metadata={"arch": arch, "arch_kwargs": json.dumps(kwargs)})
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("points")
    return {"resnet": _write(root / "resnet.safetensors", "test_resnet", {"num_classes": 10}),
            "vit": _write(root / "vit.safetensors", "test_vit",
                          {"num_classes": 10, "img_size": 32})}


def _local(path: Path, **kw: Any) -> dict[str, Any]:
    """What the engine lists for the same file in this process (random weights suffice)."""
    from stitchsim.models import ModelRef
    from stitchsim_worker.engine.models.points import checkpoint_points

    return checkpoint_points(ModelRef(checkpoint="-", **kw), path)


def test_points_of_two_architectures_over_http(live_service: ServiceHandle,
                                               models: dict[str, Path]) -> None:
    with live_service.client() as c:
        for name, path in models.items():
            cid = upload(c, path)
            r = c.get(f"/checkpoints/{cid}/points")
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["checkpoint"] == cid and got["input_size"] == 32, got
            assert {k: got[k] for k in ("arch", "points", "unstitchable")} == {
                k: v for k, v in _local(path).items() if k in ("arch", "points", "unstitchable")}
            points = {p["name"]: p for p in got["points"]}
            auto = [p for p in got["points"] if p["auto"]]
            assert 2 <= len(auto) <= 4 and all(p["stage"] for p in auto), got
            if name == "resnet":
                assert points["layer1"]["shape"] == [32, 8, 8], points["layer1"]
                assert points["layer4"] == {"name": "layer4", "shape": [96, 1, 1],
                                            "stage": True, "auto": True}
            else:  # 4 patches of 16 px and the class token, 64 wide
                assert points["blocks.5"]["shape"] == [5, 64] and points["blocks.5"]["auto"]
                assert len(got["points"]) > len(auto) + 20  # sub-modules are points too

        # Shapes at another input size; a bad query is a 422 that names the field.
        r = c.get(f"/checkpoints/{upload(c, models['resnet'])}/points",
                  params={"input_size": 64})
        assert r.status_code == 200, r.text
        layer1 = next(p for p in r.json()["points"] if p["name"] == "layer1")
        assert r.json()["input_size"] == 64 and layer1["shape"] == [32, 16, 16]
        r = c.get(f"/checkpoints/{cid}/points", params={"input_size": 2})
        assert r.status_code == 422 and "input_size" in assert_error_body(r)["message"]
        r = c.get(f"/checkpoints/sha256:{'0' * 64}/points")
        assert r.status_code == 404 and "POST /checkpoints" in r.json()["error"]["message"]


def test_sdk_and_cli_list_the_points(live_service: ServiceHandle, models: dict[str, Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with Client(live_service.url, live_service.api_key) as client:
        points = client.points(models["vit"])  # uploaded, or found by its hash
        assert points.arch == "test_vit" and points.auto == [
            p["name"] for p in _local(models["vit"])["points"] if p["auto"]]
        with pytest.raises(NotFound):
            client.points(f"sha256:{'0' * 64}")

    out = io.StringIO()
    argv = ["points", str(models["resnet"]), "--url", live_service.url]
    assert main(argv, out=out) == 0, capsys.readouterr().err
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].startswith("test_resnet at 32 px: ") and "stage outputs shown" in lines[0]
    assert lines[1].split() == ["POINT", "SHAPE", "STAGE", "AUTO"]
    assert "layer2  " in text and lines[-1] == "auto: --layers layer1,layer2,layer3,layer4"
    row = next(line.split() for line in lines if line.startswith("layer4"))
    assert row == ["layer4", "96x1x1", "S", "A"], text
    assert "layer1.0.conv1" not in text  # not a stage output: --all lists it

    out = io.StringIO()
    assert main([*argv, "--all", "--input-size", "64"], out=out) == 0
    assert "layer1.0.conv1" in out.getvalue() and "32x16x16" in out.getvalue()
    out = io.StringIO()
    assert main([*argv, "--json"], out=out) == 0
    assert json.loads(out.getvalue())["arch"] == "test_resnet"


def test_an_unknown_point_names_the_route_that_lists_them(live_service: ServiceHandle,
                                                          models: dict[str, Path]) -> None:
    with live_service.client() as c:
        cid = upload(c, models["resnet"])
        spec = tiny_spec({"checkpoint": cid}, {"checkpoint": cid},
                         layers=[{"front": "layer9", "back": "layer1"}])
        r = c.post("/similarity", json=spec)
    assert r.status_code == 422, r.text
    err = assert_error_body(r)
    assert err["code"] == "unknown_layer", err
    assert f"GET /checkpoints/{cid}/points lists every stitch point of the front model" \
        in err["message"], err
    assert "list_stitch_points" not in err["message"]
    assert err["details"]["points_route"] == f"/checkpoints/{cid}/points"
    assert err["details"]["side"] == "front" and err["details"]["point"] == "layer9"
