"""Non-private PCC and COS baselines on a fold, cached so that sweeps do not refit them."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path


from dprec_torch.data.ratings import Fold
from dprec_torch.evaluation.cross_validate import score_predictor
from dprec_torch.io import atomic_write_json
from dprec_torch.predictors.knn import ItemKNN

log = logging.getLogger(__name__)


#: bumped when the cached metrics change shape (v2: + fallback_rate), so folds never mix old and new entries
CACHE_VERSION = "v2"


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
    """Test RMSE/MAE (and the share of pairs answered by the item-mean fallback) of PCC and COS item-kNN
    (k neighbours: the paper's 900 on ML-100K, 1300 on ML-1M, see ``dprec_torch.config.paper_knn_k``)
    fitted on ``fold.train``."""
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
