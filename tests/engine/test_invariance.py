"""The invariance-aware protocol: IRIs, their cache, and the shortcut finding (issue 3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stitchsim_worker.engine.core.refcache import PREFIX, ReferenceCache

from tests.engine.jobs import FAST_IA, FAST_IRI, TINY, layers, rows, run, shared_cache, spec
from tests.engine.permuted import permuted_copy

BOTH = ["standard", "invariance_aware"]
PERMUTED = {**TINY, "max_train_samples": 200}


def test_shortcut_front_loses_agreement_under_the_invariance_aware_protocol(
    ckpts
) -> None:
    # The marker model solves the task from a corner marker; the clean model reads digits.
    # Standard stitching hides that; IRIs of the marker model keep the marker and nothing else.
    s = spec(
        ckpts.marker_resnet,
        ckpts.digits_resnet,
        dataset="digits_marker",
        objectives=["slm"],
        protocols=BOTH,
        layers=layers("layer3", "layer4"),
        train=FAST_IA,
        iri=FAST_IRI,
    )
    report = run(s, shared_cache())
    for layer in ("layer3", "layer4"):
        standard = rows(report, front_layer=layer, protocol="standard")[0]
        aware = rows(report, front_layer=layer, protocol="invariance_aware")[0]
        assert standard.agreement >= 0.8
        assert standard.agreement - aware.agreement >= 0.3, layer
    assert report.summary.similarity_protocol == "invariance_aware"
    assert report.summary.similarity == report.summary.by_protocol["invariance_aware"]


def test_identical_models_keep_high_invariance_aware_agreement(ckpts) -> None:
    s = spec(
        ckpts.digits_resnet,
        ckpts.digits_resnet,
        objectives=["slm", "dm"],
        protocols=["invariance_aware"],
        layers=layers("layer2", "layer4"),
        train=FAST_IA,
        iri=FAST_IRI,
    )
    for r in run(s, shared_cache()).results:
        assert r.agreement >= 0.9, (r.objective, r.front_layer, r.agreement)


def test_a_permuted_copy_is_stitched_back_to_the_identity_function(
    ckpts, tmp_path: Path
) -> None:
    # Two models, one function: the back model is the front's copy with the channels at both
    # points shuffled (weights permuted in and out), so the stitch must find that permutation,
    # not keep its input as it is, for the stitched model to be the front model again. With
    # one model on both sides an untouched identity stitch passes; here it does not. (The
    # relation is exact on any images, so this checks the fit, not the IRIs' quality: noise
    # in place of the IRIs passes too; test_points_matrix.py checks the IRIs themselves.)
    copy = permuted_copy(ckpts.digits_resnet, tmp_path / "permuted.safetensors")
    s = spec(
        ckpts.digits_resnet,
        copy,
        objectives=["dm"],
        protocols=["invariance_aware"],
        layers=layers("layer4.0.act1", "layer4.0.bn2"),
        # layer4.0.bn2: 96 channels at one position, so the closed form needs more than 97 IRIs.
        train=PERMUTED,
        iri={"steps": 10, "extra_rounds": 0},
    )
    report = run(s, shared_cache())
    assert report.back.accuracy == report.front.accuracy  # the same function
    assert len(report.results) == 2
    for r in report.results:
        assert r.iri is not None and r.iri.n == PERMUTED["max_train_samples"], r.iri
        assert r.agreement >= 0.99, (r.front_layer, r.agreement)
        assert r.hard_agreement >= 0.99, (r.front_layer, r.hard_agreement)
        # The IRIs' features mapped onto the copy's exactly (measured: d 3e-13 and 3e-7; an
        # unfitted identity stitch leaves d 1.3 and 1.0, and agreement 0.989, so this line
        # is the one that tells a found permutation from a kept input at these points).
        assert r.train_loss < 1e-3, (r.front_layer, r.train_loss)


def test_iris_converge_and_are_reused_from_the_cache(ckpts, tmp_path: Path) -> None:
    s = spec(
        ckpts.digits_resnet,
        ckpts.digits_resnet_b,
        objectives=["dm"],
        protocols=["invariance_aware"],
        layers=layers("layer3"),
        train=FAST_IA,
        iri=FAST_IRI,
    )
    first = run(s, tmp_path)
    stats = first.results[0].iri
    assert stats is not None and not stats.cache_hit
    assert stats.n == 200
    assert stats.median < 0.4 * stats.start_median
    # Nine IRIs in ten end closer than the typical noise start (median <= p90 <= max holds by
    # definition and says nothing).
    assert stats.p90 < stats.start_median, stats
    assert stats.converged_below == s.iri.converged_below
    assert stats.steps == s.iri.max_steps and 1 <= stats.steps_used <= stats.steps

    second = run(s, tmp_path)
    again = second.results[0].iri
    assert again is not None and again.cache_hit
    assert again.seconds < stats.seconds / 3
    assert again.steps_used == stats.steps_used
    assert second.results[0].agreement == first.results[0].agreement

    # Other IRI settings are other IRIs: no false hit.
    third = run(s.model_copy(update={"iri": s.iri.model_copy(update={"seed": 1})}), tmp_path)
    assert not third.results[0].iri.cache_hit


def _quick_iri_spec(ckpts):  # type: ignore[no-untyped-def]
    return spec(
        ckpts.digits_resnet,
        ckpts.digits_resnet_b,
        objectives=["dm"],
        protocols=["invariance_aware"],
        layers=layers("layer4"),
        train=TINY,
        iri={"steps": 10, "extra_rounds": 0},
    )


def test_corrupt_and_partial_cache_entries_are_rebuilt(ckpts, tmp_path: Path) -> None:
    s = _quick_iri_spec(ckpts)
    clean = run(s, tmp_path).results[0]
    (manifest,) = (tmp_path / PREFIX / "iri").rglob("*.json")
    digest = json.loads(manifest.read_text())["blob"]
    blob = tmp_path / ReferenceCache.blob_key(digest)
    data = bytearray(blob.read_bytes())
    data[-5] ^= 0x40  # a flipped value: the blob no longer matches its hash
    blob.write_bytes(bytes(data))
    rebuilt = run(s, tmp_path).results[0]
    assert not rebuilt.iri.cache_hit
    assert rebuilt.agreement == clean.agreement

    blob.unlink()  # as if the blob were pruned, or never written whole
    partial = run(s, tmp_path).results[0]
    assert not partial.iri.cache_hit
    assert run(s, tmp_path).results[0].iri.cache_hit


def test_unconverged_iris_are_flagged_and_void_the_verdict(ckpts, tmp_path: Path) -> None:
    s = spec(
        ckpts.digits_resnet,
        ckpts.digits_resnet,
        objectives=["dm"],
        protocols=["invariance_aware"],
        layers=layers("layer1"),
        train=TINY,
        iri={"steps": 2, "extra_rounds": 0},  # no convergence-driven rounds to rescue it
    ).model_copy(update={"threshold": 0.5})
    report = run(s, tmp_path)
    stats = report.results[0].iri
    assert not stats.converged
    assert any("did not converge" in w and "layer1" in w for w in report.warnings)
    # The report names the method and its effective settings, the verdict's caveats name it,
    # and the IRIs' pixel distance stands beside their feature distance: two steps of 1/255
    # from uniform noise leave them far from x (about 0.3-0.4 rms: noise is ~0.4 from a digit).
    assert stats.method == "paper" and report.iri_settings == s.iri.at("low")  # 32 px digits
    assert report.iri_settings.described(report.resolution) == "paper (steps 2, extra_rounds 0)"
    assert 0.2 < stats.pixel_median < 0.6 and 0.2 < stats.pixel_rms < 0.6, stats
    assert stats.steps_used == 2 and stats.steps == 2
    method, loose = report.verdict_caveats
    assert "iri.method paper (steps 2, extra_rounds 0) (the paper's code)" in method
    assert "did not converge" in loose and "iri.method paper (steps 2, extra_rounds 0)" in loose
    # Issue 36: a threshold was given, but the figure rests on IRIs the front can still tell
    # from real inputs: no verdict, the point named, and what to set.
    assert report.verdict is None and report.summary.threshold == 0.5
    reason = report.verdict_reason or ""
    assert "front_to_back layer1->layer1 (median" in reason and "2 steps" in reason, reason
    assert "iri.extra_rounds" in reason and "iri.accept_unconverged" in reason
    # Accepted explicitly: the verdict is given, on the same IRIs (the field is not the
    # IRIs': the cache serves them), the caveat stays.
    accepted = run(s.model_copy(update={"iri": s.iri.model_copy(
        update={"accept_unconverged": True})}), tmp_path)
    assert accepted.results[0].iri.cache_hit
    assert accepted.verdict in ("similar", "dissimilar") and accepted.verdict_reason is None
    assert any("did not converge" in c for c in accepted.verdict_caveats)


def test_both_directions_and_the_shortcut_control(ckpts) -> None:
    s = spec(
        ckpts.marker_resnet,
        ckpts.digits_resnet,
        objectives=["slm"],
        protocols=BOTH,
        layers=layers("layer4"),
        train=FAST_IA,
        iri=FAST_IRI,
        controls=["shortcut", "identity"],
        control_settings={"cues": ["pixel_specific"]},  # the whole suite: test_protocols.py
    )
    s = s.model_copy(update={"directions": "both"})
    report = run(s, shared_cache())
    assert {r.direction for r in report.results} == {"front_to_back", "back_to_front"}
    assert {(r.direction, r.protocol) for r in report.summary.rows} == {
        (d, p) for d in ("front_to_back", "back_to_front") for p in BOTH
    }
    shortcut = rows(report, control="shortcut", direction="front_to_back", protocol="standard")[0]
    assert shortcut.cue == "pixel_specific"
    # The marker model's features carry the marker, so the stitch can follow it: rolled
    # markers then move the stitched output away from the back model's.
    assert shortcut.excessive_agreement > 0.3
    assert shortcut.rolled_agreement == shortcut.agreement - shortcut.excessive_agreement
    assert len(rows(report, control="shortcut")) == 4  # per direction and protocol
    for r in rows(report, control="identity", protocol="standard"):
        assert r.agreement >= 0.97


def test_an_unwritable_cache_costs_the_cache_not_the_job(ckpts, tmp_path: Path) -> None:
    s = _quick_iri_spec(ckpts)
    clean = run(s, tmp_path / "ok").results[0]
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "refcache").write_text("a file where the cache's folder should be")
    first = run(s, blocked).results[0]
    assert first.agreement == clean.agreement and not first.iri.cache_hit
    assert not run(s, blocked).results[0].iri.cache_hit  # nothing was cached, nothing broke

    # A writer killed mid-write a day ago left its temp file: the next write clears it away.
    abandoned = tmp_path / "ok" / "refcache-tmp" / ".refcache-dead.tmp"
    abandoned.write_bytes(b"half an entry")
    os.utime(abandoned, (0, 0))
    run(s.model_copy(update={"iri": s.iri.model_copy(update={"seed": 5})}), tmp_path / "ok")
    assert not abandoned.exists()
