"""Building blocks of the published protocols (issue 15): the unseen-cue markers, PGD, and
the built-in shapes task; checked against their definitions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from stitchsim.models import AdversarialSettings
from stitchsim_worker.engine.data.shapes import CLASSES, make_shapes
from stitchsim_worker.engine.models.attacks import pgd
from stitchsim_worker.engine.protocols.cues import CUE_IMPLS, class_places, palette


def test_palette_colours_are_far_apart_and_fixed() -> None:
    colours = palette(10)
    assert colours.shape == (10, 3) and torch.equal(colours, palette(10))
    gaps = torch.cdist(colours, colours) + 9 * torch.eye(10)
    assert float(gaps.min()) >= 0.6  # farthest-point sampling in the unit RGB cube
    assert float(torch.cdist(torch.rand(10, 3, generator=torch.Generator().manual_seed(0)),
                             torch.rand(10, 3)).min()) < float(gaps.min())


def _marked(name: str, classes: torch.Tensor, seed: int = 0) -> torch.Tensor:
    images = torch.zeros(len(classes), 3, 32, 32)
    return CUE_IMPLS[name].mark(images, classes, 10, 4, torch.Generator().manual_seed(seed))


def test_pixel_specific_paints_the_class_colour_at_the_class_place() -> None:
    classes = torch.tensor([0, 3, 7])
    out = _marked("pixel_specific", classes)
    places, colours = class_places(10, 32, 4), palette(10)
    for n, c in enumerate(classes.tolist()):
        r, q = places[c].tolist()
        assert torch.equal(out[n, :, r : r + 4, q : q + 4],
                           colours[c].view(3, 1, 1).expand(3, 4, 4))
        assert int((out[n].abs().sum(0) > 0).sum()) == 16  # nothing else painted
    assert len({tuple(p) for p in class_places(10, 32, 4).tolist()}) == 10


def test_random_cues_place_or_colour_at_random() -> None:
    classes = torch.zeros(200, dtype=torch.long)
    rand_place = _marked("pixel_rand", classes)
    corners = {tuple((img.abs().sum(0) > 0).nonzero()[0].tolist()) for img in rand_place}
    assert len(corners) > 50  # places vary within one class
    colours = set()
    for img in _marked("rand_rand", classes):
        r, c = (img.abs().sum(0) > 0).nonzero()[0].tolist()
        colours.add(tuple(img[:, r, c].tolist()))
    assert len(colours) > 150  # so do colours: no class information at all


def test_pgd_stays_in_budget_and_raises_the_loss() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    x, y = torch.rand(16, 3, 8, 8), torch.randint(0, 10, (16,))
    settings = AdversarialSettings().at("low")  # 8 px images: 8/255, steps of 2/255
    x_adv = pgd(lambda z: F.cross_entropy(net(z), y, reduction="sum"), x, settings)
    assert float((x_adv - x).abs().max()) <= settings.epsilon + 1e-6
    assert float(x_adv.min()) >= 0 and float(x_adv.max()) <= 1
    assert F.cross_entropy(net(x_adv), y) > F.cross_entropy(net(x), y) + 0.05
    none = pgd(lambda z: net(z).sum(), x, settings.model_copy(update={"steps": 0}))
    assert torch.equal(none, x)


def test_shapes_are_a_balanced_deterministic_ten_class_task() -> None:
    x, y = make_shapes(200, seed=3)
    assert x.shape == (200, 3, 32, 32) and len(CLASSES) == 10
    assert torch.bincount(y).tolist() == [20] * 10
    assert torch.equal(make_shapes(200, seed=3)[0], x)
    # The class is the shape, not the colour: mean colour is about the same for every class.
    means = torch.stack([x[y == c].mean((0, 2, 3)) for c in range(10)])
    assert float(means.std(0).max()) < 0.05
