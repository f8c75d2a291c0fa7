"""The noise of a finite-epsilon run is secret, never a function of the recorded seed.

On the old main every noise draw came from generators seeded by ``cfg.seed``: an adversary who read
``config_resolved.json`` reran the mechanism with and without a target and matched the release bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dprec_torch
from dprec_torch import seeding

FAST = ["data=synthetic", "data.preset=tiny", "compare_baselines=false", "tensorboard=false", "device=cpu"]


def _train(tmp_path: Path, name: str, *overrides: str) -> dprec_torch.api.Run:
    return dprec_torch.train([*FAST, f"output_dir={tmp_path / name}", *overrides])


def _released_S(run) -> torch.Tensor:
    """The released similarity parameter: S (full PNBM) or U (the default low-rank PNBM, S = U U^T)."""
    return next(run.model().parameters()).detach().clone()


def test_two_identical_runs_release_different_parameters(tmp_path: Path) -> None:
    a = _train(tmp_path, "a", "mechanism=dpsgd", "epsilon=1", "mechanism.epochs=1")
    b = _train(tmp_path, "b", "mechanism=dpsgd", "epsilon=1", "mechanism.epochs=1")
    assert a.privacy["randomness"]["noise_seed"] == "secret"
    assert not torch.equal(_released_S(a), _released_S(b))
    assert not torch.equal(a.model().item_means, b.model().item_means)


def test_replaying_the_recorded_config_does_not_reproduce_the_release(tmp_path: Path) -> None:
    """The reviewer's attack: rerun with everything the run dir records; the release must not match."""
    victim = _train(tmp_path, "victim", "mechanism=dpsgd", "epsilon=1", "mechanism.epochs=1")
    recorded = json.loads((victim.dir / "config_resolved.json").read_text())
    assert recorded["noise_seed"] is None and recorded["mechanism"]["seed"] is None
    replay = _train(tmp_path, "replay", "mechanism=dpsgd", "epsilon=1", "mechanism.epochs=1", f"seed={recorded['seed']}",
                    f"noise_seed={recorded['seed']}")
    assert not torch.equal(_released_S(victim), _released_S(replay))


def test_noise_seed_reproduces_bit_for_bit_and_says_what_it_costs(tmp_path: Path) -> None:
    a = _train(tmp_path, "a", "mechanism=sgld", "epsilon=20", "mechanism.epochs=1", "noise_seed=7")
    b = _train(tmp_path, "b", "mechanism=sgld", "epsilon=20", "mechanism.epochs=1", "noise_seed=7")
    assert torch.equal(_released_S(a), _released_S(b))
    assert a.metrics["test_rmse"] == b.metrics["test_rmse"]
    rnd = a.privacy["randomness"]
    assert rnd["noise_seed"] == "explicit" and "only while that seed stays secret" in rnd["statement"]


def test_fitted_predictor_noise_is_secret(tmp_path: Path) -> None:
    a = _train(tmp_path, "a", "model=noisy_gram", "epsilon=1")
    b = _train(tmp_path, "b", "model=noisy_gram", "epsilon=1")
    assert a.metrics["test_rmse"] != b.metrics["test_rmse"]
    assert a.privacy["randomness"]["noise_seed"] == "secret"
    c = _train(tmp_path, "c", "model=noisy_gram", "epsilon=1", "noise_seed=3")
    d = _train(tmp_path, "d", "model=noisy_gram", "epsilon=1", "noise_seed=3")
    assert c.metrics["test_rmse"] == d.metrics["test_rmse"]


def test_non_private_runs_stay_reproducible_from_seed(tmp_path: Path) -> None:
    a = _train(tmp_path, "a", "mechanism=none", "epsilon=inf", "mechanism.epochs=1")
    b = _train(tmp_path, "b", "mechanism=none", "epsilon=inf", "mechanism.epochs=1")
    assert torch.equal(_released_S(a), _released_S(b))


def test_no_secret_reaches_any_file_but_the_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every root key the run draws is a sentinel here; neither it nor any key derived from it (streams, folds, jobs)
    may appear, raw or in hex, outside the checkpoint."""
    drawn: list[bytes] = []
    real_derive = seeding.derive_key

    def sentinel(n: int) -> bytes:
        drawn.append(bytes([0x5E, 0xC2, 0xE7, len(drawn)]) * (n // 4))
        return drawn[-1]

    def derive(key: bytes, *labels) -> bytes:
        out = real_derive(key, *labels)
        drawn.append(out)
        return out

    monkeypatch.setattr(seeding.secrets, "token_bytes", sentinel)
    monkeypatch.setattr(seeding, "derive_key", derive)
    run = dprec_torch.train(["data=synthetic", "data.preset=tiny", "compare_baselines=false", "tensorboard=true",
                             "device=cpu", "mechanism=dpsgd", "epsilon=1", "mechanism.epochs=1",
                             "keep_checkpoint=true",  # kept (a private run deletes it) so the scan proves it alone holds them
                             f"output_dir={tmp_path / 'run'}"])
    assert len(drawn) >= 2  # the mechanism's noise and the Poisson sampler
    files = [p for p in run.dir.rglob("*") if p.is_file() and not p.name.startswith("checkpoint")]
    assert any(p.name.startswith("events.") for p in files)  # TensorBoard was written and is scanned too
    for p in files:
        data = p.read_bytes()
        for secret in drawn:
            for form in (secret, secret.hex().encode(), secret[:16], secret[16:]):
                assert form not in data, f"{p} holds a noise key"
    ckpt = torch.load(next(run.dir.glob("checkpoint_fold*.pt")), weights_only=False)
    assert ckpt  # the generator state lives only there (the checkpoint is marked private)


@pytest.mark.parametrize("mechanism,model,secret", [("gaussian", "mf", True), ("gaussian", "pnbm_lowrank", True),
                                                    ("dpsgd", "pnbm", True), ("none", "mf", False)])
def test_the_poisson_sampler_of_a_private_mechanism_is_secret(mechanism, model, secret):
    """Poisson sampling is part of the amplification proof: every noise-drawing mechanism (``gaussian`` with MF too,
    whose relation follows its unit) draws its batches from the secret source; non-private SGD from the public seed."""
    from dprec_torch.training.run import setup_training
    from tests.helpers import tiny_cfg, tiny_fold

    def batch_users() -> torch.Tensor:
        cfg = tiny_cfg(*FAST, f"mechanism={mechanism}", f"model={model}", "epsilon=1", "mechanism.sampling_ratio=0.3")
        return setup_training(cfg, tiny_fold(), torch.device("cpu")).sampler.sample().users.clone()

    a, b = batch_users(), batch_users()
    assert (not torch.equal(a, b)) == secret
