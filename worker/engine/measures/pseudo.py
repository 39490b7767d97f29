"""Pseudo-classes for data without labels: k-means clusters of the back model's outputs. The
controls that are built from classes (the clustered-noise floor, the unseen cues) run on them
where a dataset has no labels, so an embedding or an autoencoder compared on unlabelled data
still gets its floor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

PSEUDO_CLASSES = 10
_ITERATIONS = 25


def _features(outputs: torch.Tensor) -> torch.Tensor:
    # Unit vectors: clusters by direction, as cosine reads outputs, not by magnitude.
    return F.normalize(outputs.flatten(1).float(), dim=1)


def pseudo_classes(train_out: torch.Tensor, test_out: torch.Tensor, seed: int,
                   k: int = PSEUDO_CLASSES) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means on the training outputs (k-means++ start, fixed by the seed); each test
    output joins its nearest centre. Returns int64 labels of both splits."""
    x = _features(train_out)
    k = max(1, min(k, len(x)))
    g = torch.Generator().manual_seed(seed)
    centres = x[torch.randint(0, len(x), (1,), generator=g)]
    while len(centres) < k:  # k-means++: far points are likelier centres
        d = torch.cdist(x, centres).min(1).values ** 2
        pick = torch.multinomial(d + 1e-12, 1, generator=g)
        centres = torch.cat([centres, x[pick]])
    for _ in range(_ITERATIONS):
        assign = torch.cdist(x, centres).argmin(1)
        for c in range(k):
            members = x[assign == c]
            if len(members):
                centres[c] = members.mean(0)
    train = torch.cdist(x, centres).argmin(1)
    test = torch.cdist(_features(test_out), centres).argmin(1)
    return train.long(), test.long()
