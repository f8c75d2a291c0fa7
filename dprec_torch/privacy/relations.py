"""The neighbouring relation a run's epsilon defends, checked against the run: no rating-level epsilon after a
per-user preprocessing step (:func:`check_relation_preprocessing`), delta below 1/(privacy units) (:func:`check_privacy_units`)."""

from __future__ import annotations

import logging
import math

from hydra.utils import get_object
from omegaconf import DictConfig

from dprec_torch.config import declared_parameters
from dprec_torch.errors import ConfigError
from dprec_torch.forms import form_path, model_target

log = logging.getLogger(__name__)

#: The relation of targets whose class attribute does not state the one their epsilon defends (None: none defended).
#: laplace_output is absent: its Delta f is the output range (cosine_implicit) or a substitution bound (slope_one),
#: which per-user preprocessing cannot exceed (tests/privacy/test_harness_neighbours.py).
TARGET_RELATIONS: dict[str, str | None] = {
    "dprec_torch.mechanisms.dpsgd_paper.DPSGDLaplace": None,  # Alg. 1 as printed: the paper's figure only
    "dprec_torch.mechanisms.dpsgd_mf.DPSGDMF": "rating_value",  # one rating's value changes; who rated what is public
    "dprec_torch.mechanisms.exponential_topk.ExponentialTopK": "score_entry",
    "dprec_torch.predictors.mcsherry.McSherryMironov": "rating",
}
#: Relations whose neighbours differ in one rating added, removed (or changed): a per-user step (a min-count
#: filter, a tau cap) turns that one rating into many, so their sensitivity does not survive it.
RATING_LEVEL = frozenset({"rating"})


def form_target(node: DictConfig, model: DictConfig | None = None) -> str | None:
    """The qualified class that trains ``model`` under the mechanism ``node``: the one table,
    :data:`dprec_torch.forms.FORMS` (``mechanism=dpsgd_paper model=mf``: DPSGD-MF), else its ``_target_``."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    model = model_target(model) if isinstance(model, DictConfig) else None
    return form_path(target, model) if target and model else target


def node_relation(node: DictConfig, model: DictConfig | None = None) -> str | None:
    """The neighbouring relation a node's ``_target_`` (with ``model``: the form that trains it, :func:`form_target`)
    is configured to defend (None: it states none).

    :data:`TARGET_RELATIONS`; else the node's ``relation`` where the target takes one (absent: its default);
    else the class's ``relation`` (a :class:`~dprec_torch.interfaces.TrainingMechanism` attribute); else, where
    that is None, the node's ``unit`` (Gaussian DP-SGD defends add/remove one unit). The configured value always
    wins over the class default."""
    target = form_target(node, model)
    if not target:
        return None
    if target in TARGET_RELATIONS:
        return TARGET_RELATIONS[target]
    declared = declared_parameters(target)
    if "relation" in declared:
        return str(node.get("relation", declared["relation"].default))
    fixed = getattr(get_object(target), "relation", None)  # privacy/ sits below the mechanisms: no isinstance here
    if fixed is None and "unit" in declared:
        return str(node.get("unit", declared["unit"].default))
    return fixed if isinstance(fixed, str) else None


def claimed_relations(cfg: DictConfig) -> list[tuple[str, str, DictConfig]]:
    """``(kind, relation, node)`` of every model/mechanism node that states a finite epsilon under a relation."""
    out = []
    for kind in ("mechanism", "model"):
        node = cfg.get(kind)
        model = cfg.get("model") if kind == "mechanism" else None
        rel = node_relation(node, model)
        if rel is None or "epsilon" not in declared_parameters(form_target(node, model)):
            continue  # e.g. mechanism=none, model=pnbm: nothing claimed here
        eps = node.get("epsilon", cfg.get("epsilon"))
        if eps is not None and math.isfinite(float(eps)):
            out.append((kind, rel, node))
    return out


def per_user_steps(cfg: DictConfig) -> list[tuple[str, str]]:
    """``(key=value, fix)`` of every per-user preprocessing step the run applies before its mechanism."""
    steps = []
    nodes = [("data", cfg.data)]
    inner = cfg.data.get("dataset")
    if isinstance(inner, DictConfig):  # data=<name>-val: the loader node inside the validation wrapper
        nodes.append(("data.dataset", inner))
    for path, node in nodes:
        low = node.get("min_user_ratings")
        if low is not None and int(low) > 1:  # 0 and 1 keep every present user
            steps.append((f"{path}.min_user_ratings={low}", f"{path}.min_user_ratings=0"))
        if node.get("max_user_ratings") is not None:
            steps.append((f"{path}.max_user_ratings={node.max_user_ratings}", f"{path}.max_user_ratings=null"))
    mech = cfg.mechanism
    if mech.get("_partial_") and mech.get("max_user_ratings") is not None:  # the runner's cap (training mechanisms)
        steps.append((f"mechanism.max_user_ratings={mech.max_user_ratings}", "mechanism.max_user_ratings=null"))
    return steps


def _user_level_fix(kind: str, node: DictConfig) -> str:
    declared = declared_parameters(node._target_)
    key = "relation" if "relation" in declared else "unit" if "unit" in declared else None
    return f"{kind}.{key}=user" if key else "a user-level mechanism"


def check_relation_preprocessing(cfg: DictConfig) -> None:
    """No rating-level epsilon after a per-user step: removing one rating of a user at the min-count threshold
    removes all of them, and under a tau cap it lets another rating in. Non-private runs and
    user-level relations are unaffected (the cap keeps each user's profile a function of that user alone)."""
    steps = per_user_steps(cfg)
    if not steps:
        return
    for kind, rel, node in claimed_relations(cfg):
        if rel in RATING_LEVEL:
            step, fix = steps[0]
            raise ConfigError(f"{kind}={node.get('name', node._target_)} defends relation={rel} (one rating), but {step} "
                              f"acts per user, so one rating can move many and the epsilon does not hold: set {fix} "
                              f"or {_user_level_fix(kind, node)}")


def check_privacy_units(cfg: DictConfig, n_ratings: int, n_users: int) -> None:
    """delta < 1 / (number of privacy units): ratings at rating level, users at user level. A larger delta
    allows a mechanism that publishes one unit's data outright, so its epsilon defends nothing: refused.

    delta > 1 / (10 N) is allowed but warned about (one line naming the fix): delta is the probability that the
    epsilon bound fails outright, and a mechanism that publishes each of the N units' data whole with probability
    delta is (0, delta)-DP, so at delta near 1/N it expects to leak about one unit's data in full. Dwork & Roth (2014,
    Sec. 2.3) ask for delta below the inverse of any polynomial in N; 1/(10 N) is the conventional ceiling in
    practice. Warned, not refused: between 1/(10 N) and 1/N no unit is expected to leak whole (at most 1/10 of one in
    expectation), the printed (epsilon, delta) is still what the accountant proves, and refusing would break commands
    (e.g. rating-level runs on ML-1M at the default delta=1e-6) that state their delta openly."""
    for kind, rel, node in claimed_relations(cfg):
        if "delta" not in declared_parameters(form_target(node, cfg.get("model") if kind == "mechanism" else None)):
            continue  # a pure-epsilon mechanism: delta is not part of its claim
        delta = float(node.get("delta", cfg.get("delta", 0.0)) or 0.0)
        units, what = (n_users, "users") if rel == "user" else (n_ratings, "ratings")
        if delta > 0 and delta * max(units, 1) >= 1:
            raise ConfigError(f"{kind}.delta={delta:g} is not below 1/{units} (relation={rel}: {units} {what} to "
                              f"protect), so epsilon defends nothing: set delta below {1 / max(units, 1):.2g}")
        if delta > 0 and delta * 10 * max(units, 1) > 1:
            log.warning("%s.delta=%g is above 1/(10 N) = %.2g (relation=%s: N = %d %s): delta is the chance that the "
                        "guarantee fails outright, and near 1/N one of the %d %s can leak whole; set delta=%.1g or "
                        "lower (the usual ceiling 1/(10 N))", kind, delta, 1 / (10 * max(units, 1)), rel, units, what,
                        units, what, _round_down(1 / (10 * max(units, 1))))


def _round_down(x: float) -> float:
    """``x`` rounded down to one significant digit (a delta to type)."""
    exp = math.floor(math.log10(x))
    return max(1, math.floor(x / 10**exp * (1 + 1e-9))) * 10**exp
