"""The built-in mechanisms' sensitivity cases (:mod:`dprec_torch.privacy_harness.registry`).

Each ``release(data, seed, units)`` runs the mechanism's OWN code -- its ``clip_residuals``, the model's ``surrogate_loss``
backward (dense / sparse-pair torch / numba kernels) and the mechanism's ``add_noise`` at epsilon = inf, which for these
mechanisms zeroes what is data-independent (PNBM's diagonal) and adds nothing; with ``units`` it materialises every
unit's clipped contribution by releasing that unit alone (a loop over a tiny dataset's units, never a training path).

Public state is a function of ``seed`` only (registry docstring): PNBM's S is constant 1, constant 0.5 or a symmetric
matrix of dyadic values {-1, -0.5, 0, 0.5, 1} (so |S_i| I_u sums hit the floor C exactly), and the item means r_bar
are public values from the scale (the mechanisms release them by their own DP release, accounted separately: the
gradient step is analysed with r_bar fixed). Harness floor: C = 3, so a user with 4 ratings has D = C exactly at S = 1
(7 ratings at S = 0.5).

Stated sensitivities are read from the mechanism objects themselves (``group`` x ``clip_norm``, ``clip_norm``,
``phi``, ``B_true``), so a change of calibration in a mechanism is what gets tested.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import DataError
from dprec_torch.models.batching import full_batch
from dprec_torch.privacy_harness.case import Builder, Release, SensitivityCase, public_means, unit_rows

if TYPE_CHECKING:  # the classes are imported by the builders that use them (reading the tables below imports none)
    from dprec_torch.mechanisms.base import MechanismOptimizer
    from dprec_torch.mechanisms.context import TrainingContext
    from dprec_torch.models.mf import MF
    from dprec_torch.models.pnbm import PNBM

HARNESS_FLOOR = 3.0
DYADIC = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])
PNBM_BACKENDS = (("sparse_pair", "numba"), ("sparse_pair", "torch"), ("dense", "torch"))


# ------------------------------------------------------------------ public state (seed only)
def public_S(n_items: int, seed: int) -> torch.Tensor:
    """Constant 1, constant 0.5, or symmetric dyadic values; zero diagonal."""
    gen = torch.Generator().manual_seed(int(seed))
    kind = int(seed) % 3
    if kind == 0:
        S = torch.ones(n_items, n_items)
    elif kind == 1:
        S = torch.full((n_items, n_items), 0.5)
    else:
        S = DYADIC[torch.randint(0, DYADIC.numel(), (n_items, n_items), generator=gen)]
        S = torch.triu(S, 1) + torch.triu(S, 1).T
    return S.fill_diagonal_(0.0)


def _context(data: Ratings, model: Any, tau: int | None = None) -> TrainingContext:
    from dprec_torch.mechanisms.context import TrainingContext

    return TrainingContext(total_steps=1, steps_per_epoch=1, n_ratings=max(len(data), 1), n_users=data.n_users,
                           scale=data.scale, max_user_ratings=tau, entry_bound=model.gradient_entry_bound,
                           model=model)


def _pnbm(data: Ratings, seed: int, formulation: str, backend: str) -> PNBM:
    from dprec_torch.models.pnbm import PNBM

    model = PNBM(data.n_items, floor_c=HARNESS_FLOOR, n_neighbors=data.n_items, formulation=formulation,
                 pair_backend=backend).attach(data)
    with torch.no_grad():
        model.S.copy_(public_S(data.n_items, seed))
        model.item_means.copy_(public_means(data, seed))
    return model


def _mf(data: Ratings, seed: int) -> MF:
    from dprec_torch.data.preprocess import USER_KEYS
    from dprec_torch.models.mf import MF

    model = MF(data.n_users, data.n_items, dim=2, init_std=0.5, seed=seed).attach(data)
    gen = torch.Generator().manual_seed(int(seed) + 2)
    with torch.no_grad():  # non-zero user factors and biases, so every gradient channel is exercised
        model.item_bias.weight.copy_(torch.randn(data.n_items, 1, generator=gen) * 0.5)
        model.global_bias.fill_(float(torch.randn((), generator=gen)))
        # each user's public start from (seed, the user's RAW id): the same when the id map is rebuilt without another user
        keys = data.meta.get(USER_KEYS, torch.arange(data.n_users))
        for u, key in enumerate(keys.tolist()):
            user_gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(key)) % 2**63)
            model.user_factors.weight[u] = torch.randn(2, generator=user_gen)
            model.user_bias.weight[u] = torch.randn(1, generator=user_gen) * 0.5
    return model


def _cap(data: Ratings, tau: int | None, seed: int) -> Ratings:
    if tau is None:
        return data
    from dprec_torch.data.preprocess import cap_user_ratings

    return cap_user_ratings(data, tau, int(seed))[0]


def _released_gradient(model: Any, opt: MechanismOptimizer, batch: Any, residuals: torch.Tensor) -> torch.Tensor:
    """G = sum e d r_hat/d theta by the model's backward, then the mechanism's add_noise (eps = inf: no noise)."""
    opt.zero_grad(set_to_none=True)
    model.surrogate_loss(batch, residuals).backward()
    opt.add_noise()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in model.parameters()])


def _gradient_release(model: Any, opt: MechanismOptimizer, data: Ratings, units: bool, per_rating: bool) -> Release:
    if len(data) == 0:
        return Release(torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float64),
                       torch.zeros(0, sum(p.numel() for p in model.parameters()), dtype=torch.float64) if units else None)
    means = model.item_means if model.centres_on_item_means else data.item_means()
    batch = full_batch(data, means)
    residuals = (model.batch_predict(batch) - batch.values).detach()
    clipped = opt.clip_residuals(residuals, batch, model)
    total = _released_gradient(model, opt, batch, clipped)
    rows = None
    if units:
        owner = torch.arange(batch.n_targets) if per_rating else batch.rows
        n_units = batch.n_targets if per_rating else int(batch.users.numel())
        rows = torch.stack([_released_gradient(model, opt, batch, torch.where(owner == k, clipped, torch.zeros_like(clipped)))
                            for k in range(n_units)])
    return Release(total, rows)


# ------------------------------------------------------------------ dpsgd_l1
def _dpsgd_l1_case(model_kind: str, unit: str, relation: str, clip: float, tau: int | None = None,
                   backend: tuple[str, str] = PNBM_BACKENDS[0]) -> SensitivityCase:
    def release(data: Ratings, seed: int, units: bool) -> Release:
        from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD

        data = _cap(data, tau, seed)
        model = _pnbm(data, seed, *backend) if model_kind == "pnbm" else _mf(data, seed)
        opt = ClippedLaplaceDPSGD(model.parameters(), _context(data, model, tau), math.inf, clip_norm=clip,
                                  sampling_ratio=1.0, unit=unit, relation=relation, init="random", model=model)
        opt.prepare(model)  # at epsilon = inf with init=random: releases nothing, keeps the public S
        out = _gradient_release(model, opt, data, units, per_rating=(unit == "rating"))
        out.stated = opt.group * opt.clip_norm  # the L1 sensitivity the Laplace scale c/eps_s and g assume
        return out

    name = (f"dpsgd_l1 {model_kind} unit={unit} relation={relation}" + (f" tau={tau}" if tau else "")
            + (f" {backend[0]}/{backend[1]}" if model_kind == "pnbm" else ""))
    group = 2 if relation == "rating" else 1  # the claim under test: g x c (read back from the object as `stated`)
    return SensitivityCase(name=name, relation=relation, norm=1, sensitivity=group * clip, clip_bound=clip,
                           release=release, also_change=(relation == "rating"), tau=tau,
                           max_items=8 if model_kind == "pnbm" else 6)


def dpsgd_l1_cases() -> list[SensitivityCase]:
    by_backend = [_dpsgd_l1_case("pnbm", "user", "user", clip, backend=b) for clip, b in zip((0.5, 2.0, 0.5), PNBM_BACKENDS)]
    return by_backend + [_dpsgd_l1_case("pnbm", "user", "rating", 0.5), _dpsgd_l1_case("pnbm", "user", "user", 0.5, tau=4),
                         _dpsgd_l1_case("mf", "rating", "rating", 0.5), _dpsgd_l1_case("mf", "user", "user", 0.5),
                         _dpsgd_l1_case("mf", "user", "rating", 0.5)]


# ------------------------------------------------------------------ gaussian
def _gaussian_case(model_kind: str, unit: str, clip: float, backend: tuple[str, str] = PNBM_BACKENDS[0]) -> SensitivityCase:
    def release(data: Ratings, seed: int, units: bool) -> Release:
        from dprec_torch.mechanisms.gaussian import GaussianDPSGD, GaussianPNBM

        if model_kind == "pnbm":
            model = _pnbm(data, seed, *backend)
            opt = GaussianPNBM(model.parameters(), _context(data, model), math.inf, clip_norm=clip, sampling_ratio=1.0,
                               init="random", model=model)
        else:
            model = _mf(data, seed)
            opt = GaussianDPSGD(model.parameters(), _context(data, model), math.inf, unit=unit, clip_norm=clip,
                                sampling_ratio=1.0)
        opt.prepare(model)
        out = _gradient_release(model, opt, data, units, per_rating=(unit == "rating"))
        out.stated = opt.clip_norm  # L2 sensitivity of the sum under add/remove one unit
        return out

    name = f"gaussian {model_kind} unit={unit}" + (f" {backend[0]}/{backend[1]}" if model_kind == "pnbm" else "")
    return SensitivityCase(name=name, relation=unit, norm=2, sensitivity=clip, clip_bound=clip, release=release,
                           max_items=8 if model_kind == "pnbm" else 6)


def gaussian_cases() -> list[SensitivityCase]:
    return [_gaussian_case("mf", "rating", 0.5), _gaussian_case("mf", "user", 0.5)]


def gaussian_pnbm_cases() -> list[SensitivityCase]:
    return [_gaussian_case("pnbm", "user", 0.5, PNBM_BACKENDS[0]), _gaussian_case("pnbm", "user", 2.0, PNBM_BACKENDS[2])]


# ------------------------------------------------------------------ DPSGD-MF (Berlioz et al.)
def dpsgd_mf_cases() -> list[SensitivityCase]:
    """DPSGD-MF (``mechanism=dpsgd_mf``, residual perturbation): the released pre-noise vector is every
    visited rating's error e_ui; a changed rating value moves its own error only, by at most Delta r."""

    def release(data: Ratings, seed: int, units: bool) -> Release:
        from dprec_torch.mechanisms.dpsgd_mf import DPSGDMF

        model = _mf(data, seed)
        opt = DPSGDMF(model.parameters(), _context(data, model), math.inf, sampling_ratio=1.0)
        opt.prepare(model)
        batch = full_batch(data, data.item_means())
        errors = (model.batch_predict(batch) - batch.values).detach().double()  # what perturb_residuals_ noises
        return Release(errors, None, float(opt.privacy_report()["sensitivity"]["delta_r"]))

    return [SensitivityCase(name="dpsgd mf (residual perturbation)", relation="rating_value", norm=1,
                            sensitivity=4.0, release=release, max_items=6)]


# ------------------------------------------------------------------ SGLD
def _sgld_case(model_kind: str, tau: int) -> SensitivityCase:
    """Alg. 2's exponential-mechanism view: one user moves the log-likelihood sum_u sum_i e_ui^2 / 2 at any
    public parameter by at most B (the mechanism's ``B_true`` = e_max^2 tau), after the per-user tau cap."""

    def release(data: Ratings, seed: int, units: bool) -> Release:
        from dprec_torch.mechanisms.sgld import ScaledPosteriorSGLD

        data = _cap(data, tau, seed)
        model = _pnbm(data, seed, *PNBM_BACKENDS[0]) if model_kind == "pnbm" else _mf(data, seed)
        opt = ScaledPosteriorSGLD(model.parameters(), _context(data, model, tau), math.inf, temperature=1.0,
                                  max_user_ratings=tau, likelihood_bound="model", prior_correction=False, init="random")
        opt.prepare(model)  # the chain's start: the public parameters times init_scale = 1
        if len(data) == 0:
            total = torch.zeros(1, dtype=torch.float64)
        else:
            means = model.item_means if model.centres_on_item_means else data.item_means()
            batch = full_batch(data, means)
            e = (model.batch_predict(batch) - batch.values).detach().double()
            total = (e * e).sum().reshape(1) / 2
        return Release(total, None, float(opt.B_true))

    bound = (2 * 4.0 if model_kind == "pnbm" else 4.0) ** 2 * tau  # e_max^2 tau on the 1-5 scale
    return SensitivityCase(name=f"sgld {model_kind} tau={tau}", relation="user", norm=1, sensitivity=bound,
                           release=release, tau=tau, max_items=8 if model_kind == "pnbm" else 6)


def sgld_cases() -> list[SensitivityCase]:
    return [_sgld_case("mf", 3), _sgld_case("pnbm", 4)]


# ------------------------------------------------------------------ laplace_output (Park & Acharya)
def laplace_output_cases() -> list[SensitivityCase]:
    """Per-query output perturbation: every released value moves by at most the sensitivity its per-query
    epsilon is stated for, max(Delta f, the predictor's guaranteed bound) (``epsilon_per_query``).

    Slope One (Theorem 3.1): substitution of one rating value, queries at the pairs the user has not rated.
    Cosine on implicit purchases (Theorem 3.2): add/remove/change one rating, every released score.
    """
    from dprec_torch.mechanisms.output_perturbation import LaplaceOutputPredictor
    from dprec_torch.predictors.cosine_implicit import CosineImplicit
    from dprec_torch.predictors.slope_one import SlopeOne, slope_one_sensitivity, slope_one_substitution_sensitivity

    def stated(pred: LaplaceOutputPredictor) -> float:
        r = pred.privacy_report()
        return float(r["sensitivity"]) * float(r["epsilon_per_query"]) / float(r["epsilon_nominal"]) \
            if math.isfinite(float(r["epsilon_nominal"])) else max(float(r["sensitivity"]),
                                                                   float(r["details"]["sensitivity_guaranteed"]))

    def slope_release(data: Ratings, seed: int, units: bool) -> Release | None:
        try:
            pred = LaplaceOutputPredictor(SlopeOne(T=2, phi_m=1), math.inf).fit(data)
        except DataError:  # the predictor refuses this dataset: nothing is released
            return None
        rated = torch.zeros(data.n_users, data.n_items, dtype=torch.bool)
        rated[data.users, data.items] = True
        u, i = torch.nonzero(~rated, as_tuple=True)
        return Release(pred.release(u, i).double(), None, stated(pred))

    def cosine_release(data: Ratings, seed: int, units: bool) -> Release | None:
        try:
            pred = LaplaceOutputPredictor(CosineImplicit(T=2, threshold=4.0), math.inf).fit(data)
        except DataError:
            return None
        return Release(pred.release_scores(torch.arange(data.n_users)).double().reshape(-1), None, stated(pred))

    return [
        SensitivityCase(name="laplace_output slope_one T=2 phi_m=1", relation="rating_value", norm=math.inf,
                        sensitivity=max(slope_one_sensitivity(2, 1, 4.0), slope_one_substitution_sensitivity(2, 1, 4.0)),
                        release=slope_release, max_items=6),
        SensitivityCase(name="laplace_output cosine_implicit T=2", relation="rating", norm=math.inf, sensitivity=1.0,
                        release=cosine_release, also_change=True, max_items=6),
    ]


#: Classes whose privacy_report never gives a finite epsilon (the harness test fits each predictor and checks it says so).
NON_PRIVATE: dict[str, str] = {
    "dprec_torch.mechanisms.base.MechanismOptimizer": "the template: privacy_report() says non-private, epsilon = inf",
    "dprec_torch.mechanisms.sgd.MapSGD": "the SGD update the Laplace mechanisms build on: plain MAP SGD, epsilon = inf",
    "dprec_torch.mechanisms.none.NoMechanism": "mechanism=none: plain MAP SGD, epsilon = inf",
    "dprec_torch.mechanisms.dpsgd_paper.DPSGDLaplace": ("mechanism=dpsgd_paper (Alg. 1 as printed): epsilon = None, the paper's "
                                                  "per-entry figure is epsilon_claimed_by_paper, never a defended epsilon"),
    **{f"dprec_torch.predictors.{name}": "privacy_report() says non-private (epsilon = inf)"
       for name in ("base.BasePredictor", "knn.ItemKNN", "slope_one.SlopeOne", "cosine_implicit.CosineImplicit",
                    "pncf.PNCF", "d2p.D2P")},
}


# ------------------------------------------------------------------ McSherry & Mironov
def mcsherry_cases() -> list[SensitivityCase]:
    """The five releases of :class:`McSherryMironov` under its relation (one rating added/removed).

    Steps 1 (``gsum``, ``gcnt``, ``msum``, ``mcnt``) run the predictor's ``global_effect_sums`` and materialise every
    rating's contribution (its clip bound is the stated sensitivity: |r - mid| <= span/2, a count 1). Step 3 runs its
    ``weighted_covariance`` with the item averages fixed (they are released before, by step 1: sequential
    composition analyses the covariance at a public MAvg), and materialises every user's contribution
    ``w_u r_hat_u r_hat_u^T``. Stated sensitivities: the object's ``release_sensitivities`` (what ``fit`` calibrates to).
    """
    from dprec_torch.predictors.mcsherry import McSherryMironov, global_effect_sums, weighted_covariance

    def effects_case(key: str) -> SensitivityCase:
        def release(data: Ratings, seed: int, units: bool) -> Release:
            mid = (float(data.scale.lo) + float(data.scale.hi)) / 2
            stated = McSherryMironov(epsilon=1.0).release_sensitivities(data.scale, data.n_items)[key]
            effects = lambda d: global_effect_sums(d, mid)[key].double().reshape(-1)  # noqa: E731
            total = effects(data)
            # with units: one rating at a time, through the same function
            rows = (unit_rows(data, "rating", effects) if len(data) else torch.zeros(0, total.numel())) if units else None
            return Release(total, rows, stated)

        bound = 2.0 if key in ("gsum", "msum") else 1.0  # span/2 on the harness's 1-5 scale; a count moves by 1
        return SensitivityCase(name=f"mcsherry {key}", relation="rating", norm=1, sensitivity=bound, clip_bound=bound,
                               release=release, max_items=8)

    def cov_case(clamp_b: float, beta_p: float) -> SensitivityCase:
        def release(data: Ratings, seed: int, units: bool) -> Release:
            mech = McSherryMironov(epsilon=1.0, clamp_b=clamp_b, beta_p=beta_p)
            means = public_means(data, seed)  # MAvg: released by step 1, public here (extremes make |r'| = span)
            cov = lambda d: weighted_covariance(d, means, mech.clamp_b, mech.beta_p)[0].double().reshape(-1)  # noqa: E731
            rows = unit_rows(data, "user", cov) if units else None  # one user at a time, through the same function
            return Release(cov(data), rows, mech.release_sensitivities(data.scale, data.n_items)["cov"])

        def bound_for(n_items: int) -> float:  # the case's own statement: the covariance bound at alpha = 2 span
            from dprec_torch.predictors.mcsherry import covariance_sensitivity

            return covariance_sensitivity(clamp_b, 8.0, beta_p, n_items - 1)

        return SensitivityCase(name=f"mcsherry cov B={clamp_b:g} beta_p={beta_p:g}", relation="rating", norm=2,
                               sensitivity=bound_for(6), release=release, max_items=6, sensitivity_for=bound_for)

    return [effects_case(k) for k in ("gsum", "gcnt", "msum", "mcnt")] + \
        [cov_case(1.0, 20.0), cov_case(1.0, 0.0), cov_case(0.25, 1.0), cov_case(4.0, 0.0)]


# ------------------------------------------------------------------ exponential top-k (Park & Acharya Sec. 4)
class TableScores:
    """A scorer whose score matrix C is given (the harness's ratings, mapped to entries; public default elsewhere)."""

    def __init__(self, table: torch.Tensor, score_range: tuple[float, float] | None) -> None:
        self.table = table
        if score_range is not None:
            self.score_range = lambda: score_range

    def fit(self, train: Ratings) -> "TableScores":
        return self

    def score(self, users: torch.Tensor) -> torch.Tensor:
        return self.table[users]


def exponential_topk_cases() -> list[SensitivityCase]:
    """Relation ``score_entry``: one entry of one user's score row C changes (to any value: the recommender clips
    it to the declared range). The released pre-noise quantity is the utility f(S) of EVERY candidate n-set of
    every user, computed from the sampler's own exponent ``topk_log_weights`` (f = exponent x 2 Delta / eps);
    ``||f(C) - f(C')||_inf <= Delta`` is exactly what the exponential mechanism's epsilon needs.

    C maps each harness rating v to the entry ``mid + 2 (v - mid) x (range width / span)`` (it overshoots the range
    on both sides, so clipping matters); a removed rating sets its entry back to a public default (seed only). The
    rated (excluded) items come from a public training set (seed only): eligibility is fixed, as the relation says.
    """
    import itertools

    from dprec_torch.data.ratings import dense_rows
    from dprec_torch.mechanisms import exponential_topk as et

    def case(name: str, sensitivity: float | None, score_range: tuple[float, float] | None, claimed: float,
             n: int = 2) -> SensitivityCase:
        def release(data: Ratings, seed: int, units: bool) -> Release:
            lo, hi = score_range if score_range is not None else (float(data.scale.lo), float(data.scale.hi))
            mid, smid = (lo + hi) / 2, (float(data.scale.lo) + float(data.scale.hi)) / 2
            stretch = 2 * (hi - lo) / max(float(data.scale.span), 1e-12)
            default = (lo, hi, mid)[int(seed) % 3]
            table = torch.full((data.n_users, data.n_items), default, dtype=torch.float64)
            table[data.users, data.items] = mid + (data.values.double() - smid) * stretch
            # public training set (seed only): user u rated item (u + seed) % m when seed is odd
            users = torch.arange(data.n_users)
            rated = users[: data.n_users if int(seed) % 2 else 0]
            train = Ratings(rated, (rated + int(seed)) % data.n_items, torch.full((rated.numel(),), float(data.scale.hi)),
                            data.n_users, data.n_items, data.scale)
            rec = et.ExponentialTopK(epsilon=1.0, sampler="exact", sensitivity=sensitivity).wrap(
                TableScores(table, score_range)).fit(train)
            scores = rec.scores(users)  # the mechanism's own clipping
            eligible = dense_rows(rec.indicator_, users) == 0
            logw = et.topk_log_weights(scores, eligible, rec.mech.epsilon, rec.sensitivity_)  # the sampler's exponent
            k = min(n, data.n_items)
            combos = list(itertools.combinations(range(data.n_items), k))
            sets = torch.zeros(len(combos), data.n_items, dtype=torch.float64)
            for r, combo in enumerate(combos):
                sets[r, list(combo)] = 1.0
            ok = (eligible.double() @ sets.T) == k  # sets of eligible items only: the others have probability 0
            exponent = torch.where(eligible, logw, torch.zeros_like(logw)) @ sets.T
            utility = torch.where(ok, exponent * 2 * rec.sensitivity_ / rec.mech.epsilon, torch.zeros_like(exponent))
            return Release(utility.reshape(-1), None, float(rec.privacy_report()["sensitivity"]))

        return SensitivityCase(name=name, relation="score_entry", norm=math.inf, sensitivity=claimed, release=release,
                               max_items=7)

    return [
        case("exponential_topk default (Delta = scale span)", None, None, 4.0),
        case("exponential_topk paper Delta_r = 5", 5.0, None, 5.0, n=3),
        case("exponential_topk score_range [0, 1] (cosine_implicit)", None, (0.0, 1.0), 1.0),
    ]


#: What this module harnesses: a class's qualified name -> the builder of its cases (collected by the registry).
SENSITIVITY_CASES: dict[str, Builder] = {
    "dprec_torch.mechanisms.dpsgd.ClippedLaplaceDPSGD": dpsgd_l1_cases,
    "dprec_torch.mechanisms.gaussian.GaussianDPSGD": gaussian_cases,
    "dprec_torch.mechanisms.gaussian.GaussianPNBM": gaussian_pnbm_cases,
    "dprec_torch.mechanisms.dpsgd_mf.DPSGDMF": dpsgd_mf_cases,
    "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD": sgld_cases,
    "dprec_torch.mechanisms.output_perturbation.LaplaceOutputPredictor": laplace_output_cases,
    "dprec_torch.predictors.mcsherry.McSherryMironov": mcsherry_cases,
    "dprec_torch.mechanisms.exponential_topk.ExponentialTopKRecommender": exponential_topk_cases,
}
