"""Reference figures every rating run reports beside its own model, on the same fold.

* **PCC** and **COS**: item-kNN (Pearson / cosine, the same k as the paper's baselines) fitted on the exact training
  split: NON-PRIVATE references, cached per fold so that sweeps do not refit them.
* **DP means + offset** (runs with a finite epsilon under a user- or rating-level relation): the simplest private
  recommender at the run's epsilon, so a reader sees what the learned model adds,

      r^_ui = clip(r~_i + b_u),   b_u = sum_{i in R_u} (r_ui - r~_i) / (|R_u| + beta),

  with r~ the item means released ONCE by the Laplace mechanism at pure epsilon (the whole budget, delta = 0;
  :func:`dprec_torch.privacy.item_means.release_item_means`, the one release of DP item means, posterior estimator)
  under the run's relation, and b_u read from u's own training ratings only (joint DP, as noisy_gram's offset). It is a
  SEPARATE, hypothetical release drawn only to score it: it is not part of the run's epsilon (publishing it beside the
  model would spend both by basic composition), its noise is secret like the run's own (``seeding.noise_generator``;
  reproducible only under an explicit ``noise_seed``, so ``evaluate.py`` draws a fresh one otherwise), and only its test
  metrics are written.

Only test metrics of the references are ever published (``metrics.json["baselines"]``); what each one is, and that
epsilon does not cover it, is written beside them (:func:`reference_info`) and in the run's privacy scope
(:func:`dprec_torch.privacy.scope.reference_scope`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch

from dprec_torch.data.ratings import Fold, Ratings
from dprec_torch.evaluation.cross_validate import score_predictor
from dprec_torch.io import atomic_write_json
from dprec_torch.predictors.base import BasePredictor, query_pairs, user_offsets
from dprec_torch.predictors.knn import ItemKNN
from dprec_torch.privacy.item_means import ItemMeansSpec, release_item_means
from dprec_torch.seeding import noise_generator

DP_REFERENCE_STREAM = "dp_reference"  # the reference's key stream: apart from the run's, under one noise_seed

log = logging.getLogger(__name__)


#: bumped when the cached metrics change shape (v2: + fallback_rate), so folds never mix old and new entries
CACHE_VERSION = "v2"
#: the non-private references (ItemKNN's names)
NON_PRIVATE = ("PCC", "COS")
#: the private reference's name in ``metrics.json["baselines"]``
DP_MEANS = "DP means + offset"
#: beta (damping of b_u) and the prior std of the shrunk means: noisy_gram's defaults, fixed (never tuned per run)
DP_MEANS_BETA, DP_MEANS_PRIOR_STD = 5.0, 0.5


def cache_dir() -> Path:
    return Path(os.environ.get("DPREC_CACHE", Path.home() / ".cache" / "dprec")) / "baselines"


def fold_fingerprint(fold: Fold) -> str:
    """A hash of the exact train/test triples: the cache key never confuses two folds."""
    h = hashlib.sha1()
    for r in (fold.train, fold.test):
        for t in (r.users, r.items, r.values):
            h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def baseline_metrics(fold: Fold, k: int = 900, use_cache: bool = True) -> dict[str, dict[str, float]]:
    """Test RMSE/MAE (and the share of pairs answered by the item-mean fallback) of PCC and COS item-kNN (k neighbours:
    the paper's 900 on ML-100K, 1300 on ML-1M, see ``dprec_torch.data.defaults.paper_knn_k``) fitted on
    ``fold.train``."""
    path = cache_dir() / f"{fold_fingerprint(fold)}-k{k}-{CACHE_VERSION}.json"
    if use_cache and path.exists():
        return json.loads(path.read_text())
    out = {}
    for sim in ("pearson", "cosine"):
        model = ItemKNN(similarity=sim, k=k, device=fold.train.device).fit(fold.train)
        out[model.name] = score_predictor(model, fold)
    if use_cache:
        atomic_write_json(path, out)
    return out


# --------------------------------------------------------------------------- the private reference
class DPMeansOffset(BasePredictor):
    """DP item means (Laplace, pure ``epsilon``, under ``relation``) plus each user's own damped offset (module doc).

    Unknown users get r~_i, unknown items the released global mean g. ``seed`` is the noise seed (None: secret, from
    the OS entropy source): this is a reference figure, never a release.
    """

    name = DP_MEANS
    task = "rating"

    def __init__(self, epsilon: float, relation: str, seed: int | None = None, beta: float = DP_MEANS_BETA,
                 prior_std: float = DP_MEANS_PRIOR_STD, device: torch.device | str | None = None) -> None:
        super().__init__(device)
        if not (math.isfinite(epsilon) and epsilon > 0) or relation not in ("user", "rating"):
            raise ValueError(f"DPMeansOffset needs a finite epsilon > 0 and relation user|rating, got {epsilon}, {relation}")
        self.epsilon, self.relation = float(epsilon), relation
        self.seed = None if seed is None else int(seed)
        self.beta, self.prior_std = float(beta), float(prior_std)

    def fit(self, train: Ratings) -> "DPMeansOffset":
        train = self._prepare(train)
        # never the run's own noise; drawn on the data's device (on a GPU: no CPU kernels loaded for the reference)
        gen = noise_generator(self.seed, train.device, stream=DP_REFERENCE_STREAM)
        spec = ItemMeansSpec("posterior", self.relation, "laplace", self.prior_std)
        release = release_item_means(train, spec, gen, epsilon=self.epsilon)
        self.item_avg_, self.global_avg_ = release.means.to(train.device), release.global_mean
        self.noise_std_ = release.noise_std
        self.user_offset_ = user_offsets(train, self.item_avg_, self.beta)
        self.user_counts_, self.train_ = train.user_counts(), train
        return self

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self._offset_predict(*query_pairs(users, items, self.train_, self.user_counts_, self.device, self.name))


def dp_reference_target(report: dict[str, Any], configured_epsilon: Any) -> tuple[float, str] | None:
    """(epsilon, relation) of the DP reference for a run with privacy report ``report``, or None.

    epsilon: the one the report defends, else the configured one (a paper-faithful form or SGLD that defends none is
    still compared with an honest release at the epsilon typed); relation: ``user`` or ``rating`` from the report
    (dpsgd_mf's value-change relation is weaker than the reference's rating-level one, so it reads as ``rating``).
    None without a finite epsilon, or for a relation the reference has no release for (events, score entries, a
    non-private run's None)."""
    relation = str(report.get("relation") or "")
    rel = next((r for r in ("user", "rating") if relation == r or relation.startswith(r + " ")), None)
    # a run-level report of several fold models: the reference stands beside ONE model, at one model's epsilon
    for eps in (report.get("epsilon_per_model", report.get("epsilon")), configured_epsilon):
        try:
            value = float(eps)
        except (TypeError, ValueError):
            continue
        if rel is not None and math.isfinite(value) and value > 0:
            return value, rel
    return None


def dp_reference_metrics(fold: Fold, target: tuple[float, str] | None, noise_seed: int | None) -> dict[str, dict[str, float]]:
    """``{DP_MEANS: test metrics}`` of DP means + offset at ``target`` = (epsilon, relation)
    (:func:`dp_reference_target`) on ``fold``; empty when ``target`` is None."""
    if target is None:
        return {}
    ref = DPMeansOffset(target[0], target[1], noise_seed, device=fold.train.device)  # its own stream (DP_REFERENCE_STREAM)
    return {DP_MEANS: score_predictor(ref.fit(fold.train), fold)}


def reference_metrics(fold: Fold, k: int, target: tuple[float, str] | None, noise_seed: int | None) -> dict[str, dict[str, float]]:
    """Test metrics of every reference for one fold: PCC and COS (cached) and :func:`dp_reference_metrics`."""
    return {**baseline_metrics(fold, k), **dp_reference_metrics(fold, target, noise_seed)}


def reference_info(k: int, target: tuple[float, str] | None) -> dict[str, dict[str, Any]]:
    """What each reference in ``metrics.json["baselines"]`` is: ``label`` (what tables print), ``private`` and, for the
    DP one, its ``epsilon`` and ``relation``. Written as ``metrics.json["baseline_info"]``."""
    info: dict[str, dict[str, Any]] = {
        name: {"label": f"{name} (non-private reference)", "private": False, "k": int(k),
               "what": f"item-kNN ({'Pearson' if name == 'PCC' else 'cosine'}, k={int(k)}) fitted on the exact training "
                       "split; not covered by epsilon, only its test metrics are published"}
        for name in NON_PRIVATE}
    if target is not None:
        eps, relation = target
        info[DP_MEANS] = {
            "label": f"DP item means + user offset ({relation} level, eps={eps:g}, separate release)", "private": True,
            "epsilon": eps, "delta": 0.0, "relation": relation,
            "what": (f"item means released by the Laplace mechanism at pure eps={eps:g} under the {relation}-level "
                     "relation, plus each user's own offset (joint DP): a separate release at the run's epsilon, drawn "
                     "only to score it (secret noise unless noise_seed is explicit); not part of the run's epsilon, only its test "
                     "metrics are published")}
    return info


def reference_label(name: str, info: dict[str, dict[str, Any]] | None = None) -> str:
    """How tables print reference ``name`` (runs written before ``baseline_info`` existed: PCC/COS only)."""
    return ((info or {}).get(name) or {}).get("label") or f"{name} (non-private reference)"


def log_references(writer: Any, refs: dict[str, dict[str, float]]) -> None:
    """The references' test RMSE/MAE as TensorBoard scalars ``reference/<tag_name>/test_rmse`` in a fold's writer,
    beside its own ``test/test_rmse`` (one point each: they do not train). ``writer``: a ``SummaryWriter``."""
    for name, m in refs.items():
        for key in ("rmse", "mae"):
            if key in m:
                writer.add_scalar(f"reference/{tag_name(name)}/test_{key}", m[key], 0)


def tag_name(name: str) -> str:
    """A reference's name as a TensorBoard tag part: ``PCC`` -> ``pcc``, ``DP means + offset`` -> ``dp_means_offset``."""
    return "_".join(w for w in name.lower().replace("+", " ").split())


def reference_hparams(refs: dict[str, dict[str, float]]) -> dict[str, float]:
    """The references as TensorBoard hparams metrics (``hparam/<tag_name>_test_rmse``), for ``add_hparams``'s metric
    dict beside ``hparam/test_rmse``."""
    return {f"hparam/{tag_name(name)}_test_{key}": float(m[key]) for name, m in refs.items() for key in ("rmse", "mae")
            if key in m}
