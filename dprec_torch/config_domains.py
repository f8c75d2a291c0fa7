"""The domains of the config's numbers: key -> type and valid range (:data:`DOMAINS`; :data:`TARGET_DOMAINS` where
one target gives a shared key another range), read by :func:`dprec_torch.config.check_config`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Domain:
    """A number's type and valid range; ``null``/``also`` name the non-numeric values allowed."""

    kind: type  # int, float or bool
    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    null: bool = False
    also: tuple[str, ...] = ()
    note: str = ""

    def __str__(self) -> str:
        if self.kind is bool:
            text = "true or false"
        elif self.kind is int:
            text = f"an integer >= {self.lo:g}" if math.isinf(self.hi) else f"an integer in [{self.lo:g}, {self.hi:g}]"
        else:
            text = f"a number in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        extras = [*(["null"] if self.null else []), *self.also]
        return text + "".join(f" or {e}" for e in extras) + (f" ({self.note})" if self.note else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null
        if isinstance(value, str) and value in self.also:
            return True
        if isinstance(value, bool) or self.kind is bool:  # a bool is no number; "maybe" is no bool
            return isinstance(value, bool) and self.kind is bool
        if self.kind is int and not isinstance(value, int):
            return False
        try:
            x = float(value)  # "inf" or "1e-3" from yaml are strings
        except (TypeError, ValueError):
            return False
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return not math.isnan(x) and above and below

    def invalid_example(self) -> Any:
        """A value outside the domain of the same type where one exists, else a non-number."""
        if self.kind is bool:
            return "maybe"
        if self.kind is int:
            return int(self.lo) - 1 if math.isfinite(self.lo) else "abc"
        if math.isfinite(self.hi):
            return self.hi + 0.5
        if math.isfinite(self.lo):
            return self.lo - 0.5 if not self.lo_open else self.lo
        return "abc"


def integer(lo: int, hi: float = math.inf, null: bool = False, also: tuple[str, ...] = (), note: str = "") -> Domain:
    return Domain(int, lo, hi, null=null, also=also, note=note)


def number(interval: str, null: bool = False, note: str = "") -> Domain:
    """``number("(0, 1]")``: a real in the written interval (``inf`` allowed as a bound)."""
    lo_s, hi_s = (s.strip() for s in interval.strip()[1:-1].split(","))
    return Domain(float, float(lo_s), float(hi_s), interval.strip()[0] == "(", interval.strip()[-1] == ")", null=null, note=note)


def boolean(null: bool = False, note: str = "") -> Domain:
    """``true`` or ``false`` only: ``maybe`` or ``1`` is an error, not truthy."""
    return Domain(bool, null=null, note=note)


ANY_REAL = number("(-inf, inf)")

#: Top-level keys of config.yaml / evaluate.yaml / audit.yaml.
TOP_DOMAINS: dict[str, Domain] = {
    "epsilon": number("(0, inf]", note="inf = non-private"),
    "delta": number("[0, 1)"),
    "seed": integer(0),
    "noise_seed": integer(0, null=True, note="null = secret noise from the OS entropy source"),
    "baseline_k": integer(1, null=True, note="null = 900 on ML-100K, 1300 on ML-1M"),
    "eval.topn": integer(1),
    "eval.relevance_threshold": ANY_REAL,
    "audit.trials": integer(1),
    "audit.canaries": integer(2),
    "audit.history": integer(0),
    "audit.guess_fraction": number("(0, 0.5]"),
    "audit.alpha": number("(0, 1)"),
    "audit.probe_ratings": integer(1),
    "resume": boolean(),
    "keep_checkpoint": boolean(note="false = a private run's secret checkpoint is deleted once its release is written"),
    "checkpoint_every": integer(1, also=("auto", "end"), note="auto = every epoch with resume=true, else every 60 s"),
    "compare_baselines": boolean(),
    "tensorboard": boolean(),
}

#: Key -> domain, shared by every target that takes the key (its meaning is the same everywhere).
DOMAINS: dict[str, Domain] = {
    # privacy and seeds
    "epsilon": number("(0, inf]", note="inf = non-private"),
    "delta": number("[0, 1)"),
    "seed": integer(0, null=True, note="a mechanism's noise seed: null = secret (OS entropy)"),
    "support_seed": integer(0),
    "item_features": Domain(bool, also=("auto",), note="auto = on when the dataset has a public catalogue attached"),
    # data
    "fold": integer(1, also=("all",)),
    "n_folds": integer(1),
    "test_fraction": number("(0, 1)"),
    "fraction": number("(0, 1)"),
    "min_user_ratings": integer(0),
    "max_user_ratings": integer(1, null=True),
    "n_users": integer(1, null=True),
    "n_items": integer(1, null=True),
    "n_ratings": integer(1, null=True),
    "rank": integer(1),
    # models and predictors
    "dim": integer(1),
    "init_std": number("[0, inf)"),
    "mu_scale": number("[0, inf)"),
    "floor_c": number("(0, inf)"),
    "n_neighbors": integer(1),
    "init_scale": number("[0, inf)"),
    "predict_batch_users": integer(1),
    "pair_budget": integer(1),
    "block_budget": integer(1),
    "dense_max_items": integer(0),
    "sparse_k": integer(1),
    "support_shrinkage": number("[0, inf)"),
    "k": integer(1),
    "min_support": integer(0),
    "shrinkage": number("[0, inf)"),
    "batch_size": integer(1),
    "T": integer(1),
    "phi_m": integer(0),
    "delta_r": number("(0, inf)", null=True, note="null = the data's scale span"),
    "threshold": number("(-inf, inf)", null=True),
    "p": number("[0, 1]"),
    "p_star": number("[0, 1]", null=True),
    "lam": number("[0, inf)"),
    "neighbor_groups": integer(0, null=True),
    "like_fraction": number("[0, 1]"),
    "clamp_b": number("(0, inf)"),
    "beta_m": number("[0, inf)"),
    "beta_p": number("[0, inf)"),
    "variance_floor": number("[0, inf)"),
    "knn_shrinkage": number("[0, inf)"),
    "mean_prior_std": number("(0, inf)"),
    "mean_popularity_alpha": number("[0, inf)", note="0 = one plain item-statistics release"),
    "feature_reg": number("(0, inf)", note="ridge of each user's weights on the public item features"),
    "mean_popularity_share": number("(0, 1)"),
    "reg": number("[0, inf)"),
    "eig_threshold": number("[0, inf)"),
    "prior_power": number("[0, inf)"),
    "block": integer(1),
    "iterations": integer(1),
    "power_iters": integer(0),
    "max_ratings_per_user": integer(1, null=True, note="null = every rating (only without noise)"),
    "clip_factor": number("(0, inf)"),
    "clamp_r": number("(0, inf)"),
    "item_reg": number("(0, inf)"),
    "noise_reg": number("[0, inf)"),
    "init_fraction": number("[0, 1)"),
    "count_weight": number("(0, inf)", null=True, note="null = the relation's default count weight"),
    "steps": integer(1),
    "clip": number("(0, inf)"),
    "momentum": number("[0, 1)"),
    **{f"budget.{share}": number("(0, 1]") for share in ("gsum", "gcnt", "msum", "mcnt", "cov")},
    "w": number("[0, inf)", null=True, note="null = max(s_k, 0)"),
    # mechanisms
    "lr": number("(0, inf)"),
    "weight_decay": number("[0, inf)"),
    "beta": number("(0, inf)"),
    "sampling_ratio": number("(0, 1]"),
    "epochs": integer(1),
    "clip_norm": number("(0, inf)"),
    "noise_multiplier": number("[0, inf)", null=True, note="null = from epsilon"),
    "mean_fraction": number("(0, 1)"),
    "mean_feature_prior": boolean(note="the item means' prior mean from public item features (low-rank PNBM)"),
    "select_rounds": number("[1, inf)", note="the expected number of private-selection rounds"),
    "select_score_share": number("(0, 1)"),
    "select_validation": number("(0, 1)"),
    "mean_global_fraction": number("(0, 1)"),
    "mean_shrinkage": number("[0, inf)"),
    "init_value": ANY_REAL,
    "chunk_pairs": integer(1),
    "decay": number("[0, inf)"),
    "lr_decay": number("(0, 1]", note="per-epoch factor on lr (mechanism=none)"),
    "rating_reg": number("[0, inf)", note="per-visited-rating L2 (mechanism=none, model=mf)"),
    "temperature": number("(0, 1]"),
    "prior_kappa": number("(0, inf)", null=True, note="null = weight_decay as given"),
    "prior_mean": ANY_REAL,
    "e_max": number("(0, inf)", null=True),
    "sensitivity": number("(0, inf)", null=True, note="null = the model's score range"),
    "n1": integer(1),
    "n2": integer(1),
    "n_iter": integer(1),
    "dt": number("(0, inf)", null=True, note="null = 1/U_s"),
    "max_exact_items": integer(0),
}

_GAUSSIAN_DELTA = number("(0, 1)", note="the Gaussian mechanism needs delta > 0")
#: Where one target gives a shared key another range.
TARGET_DOMAINS: dict[str, dict[str, Domain]] = {
    "dprec_torch.predictors.knn.ItemKNN": {"k": integer(1, null=True, note="null = 900 on ML-100K, 1300 on ML-1M")},
    "dprec_torch.predictors.mcsherry.McSherryMironov": {"delta": _GAUSSIAN_DELTA},
    "dprec_torch.mechanisms.gaussian.GaussianDPSGD": {"delta": _GAUSSIAN_DELTA},
    "dprec_torch.mechanisms.gaussian.GaussianPNBM": {"delta": _GAUSSIAN_DELTA},
    "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD": {"max_user_ratings": integer(
        1, null=True, note="tau bounds B in the posterior-sampling chain, which refuses null (no cap)")},
    "dprec_torch.predictors.dpals.DPALS": {"reg": number("(0, inf)"), "init_scale": number("(0, inf)"), "delta": _GAUSSIAN_DELTA},
    "dprec_torch.predictors.noisy_gram.NoisyGram": {"delta": _GAUSSIAN_DELTA,
                                                    "support": integer(2, null=True, note="null = all items")},
}


def domain_of(target: str | None, key: str) -> Domain | None:
    """The domain of ``key`` (a dotted path inside the node) for ``target``; None if it has none."""
    return TARGET_DOMAINS.get(target or "", {}).get(key) or DOMAINS.get(key)
