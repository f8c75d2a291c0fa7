"""What a run's epsilon covers, and which reported numbers no mechanism protects.

A run writes more than its model: per-epoch diagnostics, reference baselines, test metrics, dataset counts.
:func:`privacy_scope` lists, next to the mechanism's epsilon, the released artefacts that epsilon covers and the
reported quantities it does not. ``log_private_diagnostics`` (top-level key) decides whether what is computed from the
training data WITHOUT noise FOR THE PRIVATE MODEL -- the exact train RMSE, the pre-noise gradient norm -- is written
at all: ``null`` (auto) writes it only for runs without a finite epsilon (:func:`diagnostics_enabled`). The reference
baselines (non-private PCC/COS, and DP item means at the run's epsilon) are test metrics like the model's own and
follow ``compare_baselines`` alone; :func:`reference_scope` says what they are and that epsilon does not cover them.

The scope also states what the run treats as public without protecting it: the item
universe (MovieLens: the public catalogue; data without one: the rated items, treated as public) and
the number of users. Loaders record the universe in ``Ratings.meta`` (:func:`item_universe_of`).
"""

from __future__ import annotations

import math
from typing import Any

from dprec_torch.data.ratings import ITEM_UNIVERSE, ItemUniverse, Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.models.pnbm_lowrank import LowRankPNBM

#: quantities computed from the exact training ratings without noise: never covered by epsilon
NON_PRIVATE_DIAGNOSTICS = {
    "train_rmse": "per-epoch RMSE of the unclipped, noise-free residuals on the training ratings",
    "grad_norm": "per-epoch norm of the summed gradient BEFORE the noise",
}


def has_finite_epsilon(report: dict[str, Any]) -> bool:
    """True when the mechanism's report defends a finite epsilon (a provable mechanism)."""
    eps = report.get("epsilon")
    try:
        return eps is not None and math.isfinite(float(eps))
    except (TypeError, ValueError):
        return False


def diagnostics_enabled(setting: Any, report: dict[str, Any]) -> bool:
    """``log_private_diagnostics``: true/false as set; null (auto) = true only without a finite epsilon.

    It governs only what is computed from the training data for the private model (train RMSE, pre-noise
    norms), never the reference baselines (``compare_baselines``, :func:`reference_scope`)."""
    if setting is None:
        return not has_finite_epsilon(report)
    if isinstance(setting, bool):
        return setting
    raise ConfigError(f"log_private_diagnostics={setting!r} is invalid: use true, false or null (auto)")


def _model_artefacts(model: Any, report: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(covered, not covered) artefacts of a trained nn.Module model (PNBM, PNBM-topk, MF)."""
    covered = ["the trained model parameters (" + ", ".join(n for n, _ in model.named_parameters()) + ")"]
    not_covered: list[str] = []
    if model.centres_on_item_means:  # BaseModel's flags and defaults, read directly
        if report.get("item_means"):
            covered.append("the item means r_bar and the fallback built from them (a DP release counted in epsilon)")
        else:
            not_covered.append("the item means r_bar (exact training means, a model buffer)")
    if model.privacy_caveat:
        not_covered.append("the top-k support of S (chosen from the training data)")
    if model.reads_own_ratings:
        covered.append("predictions for user u, which also read u's own training ratings (joint DP: covered "
                       "only when each user sees nothing but their own predictions)")
    elif model.fallback == "mean":
        not_covered.append("predictions for users/items without training ratings (model.fallback=mean: exact means)")
    else:
        covered.append("predictions (post-processing of the parameters)")
    return covered, not_covered


def item_universe_of(ratings: Ratings) -> ItemUniverse:
    """The item universe a loader recorded in ``ratings.meta``; without one (custom, synthetic data), the
    ``n_items`` items of the data, treated as public."""
    universe = ratings.meta.get(ITEM_UNIVERSE)
    return universe if isinstance(universe, ItemUniverse) else ItemUniverse(int(ratings.n_items))


def privacy_scope(report: dict[str, Any], model: Any = None, diagnostics: bool = True,
                  universe: ItemUniverse | None = None) -> dict[str, Any]:
    """The ``scope`` object of ``metrics.json``'s privacy record.

    ``universe`` (:func:`item_universe_of` of the fold's train ratings) says where the item index comes from
    and goes into ``treated_as_public``; None states only that the item universe and the user count are
    treated as public.
    """
    finite = has_finite_epsilon(report)
    not_covered = [
        "test metrics (test_rmse, ... and the per-epoch test columns): the released model scored on held-out "
        "test ratings, which epsilon does not cover",
        "dataset counts in 'dataset' (ratings, users and items per fold, preprocessing drops)",
        "checkpoint_fold*.pt: SECRET resume state holding the noise and sampler generators' state (the run's noise "
        "key) and pre-noise statistics; a private run deletes it once its release is written (kept only with "
        "resume=true or keep_checkpoint=true): never publish it; publish release_fold<k>.pt, the model as released",
    ]
    if model is not None:
        covered, extra = _model_artefacts(model, report)
    else:
        # an output mechanism may list what it releases in its report ("releases"); else point at its analysis
        covered = list(report.get("releases") or [f"the outputs of {report.get('mechanism', 'the mechanism')} "
                                                  "described in 'analysis'"])
        extra = []
    if not finite:
        extra, covered = covered + extra, []
    logged = {k: v for k, v in NON_PRIVATE_DIAGNOSTICS.items()} if diagnostics else {}
    public = universe.scope() if universe is not None else [
        "the item universe (the items the loaded data indexes) and the number of users are treated as public, "
        "not protected by epsilon"]
    if isinstance(model, LowRankPNBM) and model.features_ is not None:  # public item metadata the model reads
        public = [*public, model.public_item_features()]
    return {
        "epsilon_covers": covered,
        "not_covered": extra + not_covered + [f"{k}: {v}" for k, v in logged.items()],
        "treated_as_public": public,
        "non_private_diagnostics_logged": bool(diagnostics),
        "note": ("epsilon covers exactly the artefacts in epsilon_covers" if finite else
                 "no finite epsilon is defended: every released artefact is non-private"),
    }


def reference_scope(info: dict[str, dict[str, Any]]) -> list[str]:
    """``not_covered`` lines for the reference baselines a run reports (``info``: ``metrics.json["baseline_info"]``,
    :func:`dprec_torch.evaluation.baselines.reference_info`)."""
    lines = []
    plain = [n for n, i in info.items() if not i.get("private")]
    if plain:
        k = info[plain[0]].get("k")
        lines.append(f"reference baselines {'/'.join(plain)} (item-kNN, k={k}): NON-PRIVATE, fitted on the exact training "
                     "split, which epsilon does not cover; only their test metrics ('baselines') are published, never "
                     "the fitted models")
    for name, i in info.items():
        if i.get("private"):
            lines.append(f"reference baseline '{name}': a SEPARATE release at pure epsilon={i['epsilon']:g} "
                         f"({i['relation']} level), drawn only to score it and not part of this run's epsilon "
                         "(publishing it beside the model would spend both); only its test metrics are published")
    return lines
