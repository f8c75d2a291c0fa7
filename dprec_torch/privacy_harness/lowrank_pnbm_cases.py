"""Sensitivity-harness cases for the low-rank PNBM's mechanisms (``model=pnbm_lowrank``).

The low-rank form is trained by the same mechanism classes as the full form (``gaussian`` = :class:`GaussianPNBM`,
``sgld`` = the clipped chain :class:`ClippedSGLD`, ``dpsgd`` = :class:`ClippedLaplaceDPSGD`), so its cases are ADDED
to each class's registered cases (:data:`SENSITIVITY_CASES`, concatenated by the registry). Each release runs the
model's and the mechanism's own code on the harness's dataset: a :class:`~dprec_torch.models.pnbm_lowrank.LowRankPNBM`
whose U and item means are public (drawn from the seed and the item count only), one user-level full batch, the
Trainer's residuals (``batch_predict - training_targets``), the mechanism's ``clip_residuals`` and the model's
``surrogate_loss`` backward; the release is the gradient of U (the pre-noise clipped sum), and a user's row is the
same with every other user's residuals zeroed. Claims: (a) each user's clipped gradient has norm <= C (Frobenius for
the Gaussian mechanisms, L1 for the Laplace one); (b) adding or removing one user moves the sum by <= C.

With public item features (``model.item_features``): the same steps where each user's y is what their own ridge
weights on seeded random public genres leave (a function of the user's ratings and public data only).

Plus the item statistics of the DP item means (:func:`~dprec_torch.privacy.item_means.release_item_means`, user level,
Gaussian L2 / Laplace L1 sensitivity 1) with the count weight the low-rank mechanisms use.
"""

from __future__ import annotations

import math

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.privacy_harness.case import Builder, Release, SensitivityCase, public_means, unit_rows


def _model(data: Ratings, seed: int, rank: int, init_std: float, clamp_r: float, beta_p: float, features: bool = False):
    from dprec_torch.data.item_features import ITEM_FEATURES, random_item_features
    from dprec_torch.models.pnbm_lowrank import LowRankPNBM

    model = LowRankPNBM(data.n_items, rank=rank, init_std=init_std, clamp_r=clamp_r, beta_p=beta_p, seed=seed,
                        item_features=features)
    if features:  # public item features drawn from the seed alone (each user's own weights on them enter y)
        data = Ratings(data.users, data.items, data.values, data.n_users, data.n_items, data.scale,
                       meta={**data.meta, ITEM_FEATURES: random_item_features(data.n_items, n_genres=3, seed=seed)})
    model.bind(data)
    with torch.no_grad():
        model.item_means.copy_(public_means(data, seed))  # public: released before the steps
    return model


def _context(data: Ratings, model) -> object:
    from dprec_torch.mechanisms.context import TrainingContext

    return TrainingContext(total_steps=1, steps_per_epoch=1, n_ratings=max(len(data), 1), n_users=max(data.n_users, 1),
                           scale=data.scale, model=model, n_units=max(data.n_users, 1),
                           expected_batch_size=float(max(data.n_users, 1)), gradient_reduction="mean")


def _gradient(model, batch, clipped: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    model.surrogate_loss(batch, clipped).backward()
    return model.U.grad.detach().double().reshape(-1).clone()


def _step_release(model, opt, data: Ratings, units: bool) -> Release:
    """The pre-noise clipped sum of one user-level step, and each user's clipped contribution."""
    from dprec_torch.models.batching import full_batch

    size = model.U.numel()
    if len(data) == 0:
        return Release(torch.zeros(size, dtype=torch.float64), torch.zeros(0, size, dtype=torch.float64) if units else None)
    batch = full_batch(data, model.item_means)
    residuals = (model.batch_predict(batch) - model.training_targets(batch)).detach()
    clipped = opt.clip_residuals(residuals, batch, model)
    total = _gradient(model, batch, clipped)
    rows = None
    if units:
        rows = torch.stack([_gradient(model, batch, torch.where(batch.rows == k, clipped, torch.zeros_like(clipped)))
                            for k in range(int(batch.users.numel()))])
    return Release(total, rows)


def _make(mechanism: str, model, data: Ratings, clip: float):
    """The mechanism at epsilon = inf, prepared (it releases nothing: the item means stay the public ones)."""
    ctx = _context(data, model)
    if mechanism == "gaussian":
        from dprec_torch.mechanisms.gaussian import GaussianPNBM

        opt = GaussianPNBM(model.parameters(), ctx, math.inf, clip_norm=clip, sampling_ratio=1.0, model=model)
    elif mechanism == "sgld":
        from dprec_torch.mechanisms.clipped_sgld import ClippedSGLD

        opt = ClippedSGLD(model.parameters(), ctx, math.inf, clip_norm=clip, sampling_ratio=1.0)
    else:
        from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD

        opt = ClippedLaplaceDPSGD(model.parameters(), ctx, math.inf, clip_norm=clip, sampling_ratio=1.0, model=model)
    opt.prepare(model)
    return opt


def _step_case(mechanism: str, clip: float, rank: int, init_std: float, clamp_r: float = 1.0, beta_p: float = 2.0,
               features: bool = False) -> SensitivityCase:
    norm = 1 if mechanism == "dpsgd" else 2

    def release(data: Ratings, seed: int, units: bool) -> Release:
        model = _model(data, seed, rank, init_std, clamp_r, beta_p, features)
        opt = _make(mechanism, model, data, clip)
        out = _step_release(model, opt, model.history, units)
        out.stated = float(opt.clip_norm)  # what the mechanism calibrates its noise to (one step's sensitivity)
        return out

    return SensitivityCase(name=f"{mechanism} lowrank-pnbm step C={clip:g} d={rank} U-scale={init_std:g} Gr={clamp_r:g}"
                                + (" public item features" if features else ""), relation="user", norm=norm,
                           sensitivity=clip, clip_bound=clip, release=release, max_items=8)


def _item_stats_case(mechanism: str, noise: str, count_weight: float | None) -> SensitivityCase:
    """The item statistics (S, gamma C) the low-rank mechanisms' DP item means release (user level)."""
    from dprec_torch.privacy.item_means import item_stats, item_stats_sensitivity

    def release(data: Ratings, seed: int, units: bool) -> Release:
        total = item_stats(data, "user", noise, count_weight)
        rows = unit_rows(data, "user", lambda d: item_stats(d, "user", noise, count_weight)) if units and len(data) else None
        return Release(total, rows, item_stats_sensitivity("user", noise, count_weight))

    return SensitivityCase(name=f"{mechanism} lowrank-pnbm item means {noise} gamma={count_weight}", relation="user",
                           norm=2 if noise == "gaussian" else 1, sensitivity=1.0, clip_bound=1.0, release=release, max_items=8)


def gaussian_cases() -> list[SensitivityCase]:
    return [_step_case("gaussian", 0.5, 2, 1.0), _step_case("gaussian", 0.05, 3, 3.0, clamp_r=2.0),
            _step_case("gaussian", 10.0, 1, 0.01), _step_case("gaussian", 0.5, 2, 1.0, features=True),
            _step_case("gaussian", 0.05, 3, 3.0, clamp_r=2.0, features=True), _item_stats_case("gaussian", "gaussian", 0.5)]


def sgld_cases() -> list[SensitivityCase]:
    return [_step_case("sgld", 0.5, 2, 1.0), _step_case("sgld", 0.05, 3, 3.0, clamp_r=2.0), _item_stats_case("sgld", "gaussian", 0.5)]


def dpsgd_cases() -> list[SensitivityCase]:
    return [_step_case("dpsgd", 0.5, 2, 1.0), _step_case("dpsgd", 0.05, 3, 3.0, clamp_r=2.0),
            _step_case("dpsgd", 0.5, 2, 1.0, features=True), _item_stats_case("dpsgd", "laplace", 0.5)]


#: What this module harnesses: a class's qualified name -> the builder of its cases. The registry appends these to
#: the full form's cases of the same classes (``sensitivity_cases``, collected first).
SENSITIVITY_CASES: dict[str, Builder] = {
    "dprec_torch.mechanisms.gaussian.GaussianPNBM": gaussian_cases,
    "dprec_torch.mechanisms.clipped_sgld.ClippedSGLD": sgld_cases,
    "dprec_torch.mechanisms.dpsgd.ClippedLaplaceDPSGD": dpsgd_cases,
}
