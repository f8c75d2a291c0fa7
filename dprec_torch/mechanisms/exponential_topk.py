"""``mechanism=exponential_topk``: exponential-mechanism top-k sets (Park & Acharya 2011, Sec. 4).

How the converted PDF was read
------------------------------
* Eq. (28): ``P(S) = phi(C, S)^(eps/2) / sum_S' phi(C, S')^(eps/2)`` over all k-subsets S of items for one user, where
  C is the completed score matrix.
* Prop. 4.2: ``phi(C, S) = exp(f(C, S) / U_r)`` with ``f(C, S) = sum_{j in S} c_ij`` (the PDF's "exp(1/U_r)f(S)" is
  read as ``exp(f/U_r)``). Hence ``P(S) ∝ exp(eps * f(S) / (2 * Delta))`` with ``Delta`` the largest change of one
  entry of C. Scores are clipped to the predictor's range ``[lo, hi]`` first, so ``Delta = hi - lo`` is exact (4 on
  MovieLens); the paper's ``U_r = 5`` is a looser bound (pass ``sensitivity=5`` to reproduce it). By Theorem 2.2
  (``phi^eps`` is 2eps-DP) the exponent ``eps/2`` gives eps-DP.
* Sec. 4.2, birth-death chain over candidate sets ``S_0, S_1, ...``: DTMC with ``p_{j,j+1} = lambda_j dt``,
  ``p_{j,j-1} = mu_j dt`` (Eq. (34)), needing ``(lambda_j + mu_j) dt <= 1`` (Eq. (36)); Prop. 4.1 gives
  ``dt <= 1/U_s``. **Correction:** with the rates of Eq. (31) (exponent eps/2) detailed balance gives ``pi ∝ phi^eps``
  (Eq. (32)), not Eq. (28); that is 2eps-DP. We use ``lambda_j = sqrt(w_{j+1}/w_j)``, ``mu_{j+1} = sqrt(w_j/w_{j+1})``
  with ``w = phi^(eps/2)``, so ``lambda_j / mu_{j+1} = w_{j+1}/w_j`` and the stationary law is exactly Eq. (28)
  restricted to the candidates. ``dt = 1/U_s`` with ``U_s = max_j (lambda_j + mu_j)`` computed per user, which
  satisfies Eq. (36) by construction.
* Sec. 4.4, window candidates: sort the user's scores, ``S_0`` = the top k; ``S_j`` drops one of the last ``N1`` items
  of ``S_0`` and adds one item from a window of ``N2`` items right of position k; the window slides by ``N2`` after
  every ``N1*N2`` sets. Reconstructed indices (0-based sorted positions, ``j >= 1``): ``b = (j-1) // (N1 N2)``,
  ``r = (j-1) % (N1 N2)``, drop ``k-1 - r // N2``, add ``k + b N2 + r % N2`` (kept while the added position exists).
  Prop. 4.1 assumes ``phi(S_j) >= phi(S_{j+1})``; the window order only approximates it, so the generated candidates
  are sorted by f (``O(J log J)``, J ~ N1 (M-k)).

Beyond the paper: exact sampling
--------------------------------
f is additive, so ``P(S) ∝ prod_{j in S} w_j`` with ``w_j = exp(eps c_ij / (2 Delta))``, normalised by the elementary
symmetric polynomial ``e_k(w)``; ``E[i, r] = log e_r(w_i..w_{M-1}) = logaddexp(E[i+1, r], log w_i + E[i+1, r-1])``.
Walking the items once, item i joins with probability ``w_i e_{r-1}(w_{i+1:}) / e_r(w_{i:})`` (r = slots left): an
exact draw in ``O(M k)``, vectorised over users, in log-space.

Privacy (see :meth:`ExponentialTopKRecommender.privacy_report`)
------------------------------------------------------------------
Unit: one entry of the user's score row ``C_i`` (the paper's "dynamic attack", Sec. 4.1). One entry, clipped to the
score range ``[lo, hi]``, moves f(S) of any set by at most ``hi - lo``, so a smaller ``sensitivity`` is refused
(``ConfigError``). The exact sampler is eps-DP per released set; users use disjoint rows of C (parallel composition);
repeated draws for one user add up, composed in the report's ``epsilon`` (``epsilon_per_set`` beside it). The harness
case ``exponential_topk`` (:mod:`dprec_torch.privacy_harness.sensitivity_cases`) checks the bound on the sampler's own
exponent. Nothing is said about the *training* ratings: one rating can move many entries of C, so training-data privacy
needs a private scorer underneath. The MCMC sampler has no finite epsilon: its candidates depend on C's ranking, so a
neighbouring C' has candidates of zero probability under C (and a finite chain is not at stationarity); the paper's
"(eps + delta eps)" is not quantified anywhere.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings, dense_rows
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.interfaces import FittedPredictor, Predictor, Scorer
from dprec_torch.predictors.release import ReleasesState
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.seeding import SecretGenerator, noise_generator

_NEG_INF = float("-inf")
#: users per block for the exact sampler (its table is [M+1, block, k+1] float64)
_BLOCK = 128


# ------------------------------------------------------------------ weights
def topk_log_weights(scores: torch.Tensor, eligible: torch.Tensor, epsilon: float, sensitivity: float) -> torch.Tensor:
    """``log w_j = eps * c_j / (2 Delta)`` (Prop. 4.2 with exponent eps/2, Eq. (28)); ``-inf`` where not eligible."""
    logw = scores.double() * (epsilon / (2.0 * sensitivity))
    return logw.masked_fill(~eligible, _NEG_INF)


# ------------------------------------------------------------ exact sampler
def elementary_log_table(logw: torch.Tensor, k: int) -> torch.Tensor:
    """``E[i, u, r] = log e_r(w_{u,i}, ..., w_{u,M-1})`` for ``r = 0..k``, shape ``[M+1, U, k+1]``: a backward
    recursion over items (one step per item, batched over users and r)."""
    n_users, n_items = logw.shape
    table = torch.full((n_items + 1, n_users, k + 1), _NEG_INF, dtype=torch.float64, device=logw.device)
    table[:, :, 0] = 0.0
    for i in range(n_items - 1, -1, -1):
        nxt = table[i + 1]
        table[i, :, 1:] = torch.logaddexp(nxt[:, 1:], logw[:, i, None] + nxt[:, :-1])
    return table


def topk_log_normalizer(logw: torch.Tensor, k: int) -> torch.Tensor:
    """``log sum_{|S|=k} prod_{j in S} w_j = log e_k(w)`` per user, ``[U]``."""
    return elementary_log_table(logw, k)[0, :, k]


def topk_log_prob(logw: torch.Tensor, sets: torch.Tensor) -> torch.Tensor:
    """Exact ``log P(S)`` of Eq. (28) for ``sets`` (``[U, k]`` item ids, one set per user row)."""
    k = sets.shape[1]
    return logw.gather(1, sets).sum(1) - topk_log_normalizer(logw, k)


def sample_topk_exact(logw: torch.Tensor, k: int, generator: SecretGenerator) -> torch.Tensor:
    """One exact draw from ``P(S) ∝ prod_{j in S} w_j`` over k-subsets per user row: a ``[U, M]`` bool mask with
    ``min(k, #eligible)`` items per row."""
    n_users, n_items = logw.shape
    table = elementary_log_table(logw, k)
    left = torch.isfinite(logw).sum(1).clamp_max(k)  # slots to fill per user
    chosen = torch.zeros(n_users, n_items, dtype=torch.bool, device=logw.device)
    log_u = generator.rand(n_users, n_items, dtype=torch.float64, device=logw.device).log()
    for i in range(n_items):
        r = left.clamp_min(1)[:, None]
        # P(item i joins | r slots left) = w_i e_{r-1}(w_{i+1:}) / e_r(w_{i:})
        log_p = logw[:, i] + table[i + 1].gather(1, r - 1).squeeze(1) - table[i].gather(1, r).squeeze(1)
        take = (left > 0) & (log_u[:, i] < log_p)
        chosen[:, i] = take
        left = left - take.long()
    return chosen


# ---------------------------------------------------------- window + chain
def window_candidates(n_eligible: torch.Tensor, k: int, n1: int, n2: int, n_items: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sec. 4.4 candidate sets as (drop, add) sorted positions, ``[J]`` each, plus validity ``[U, J]``: candidate 0 is
    ``S_0`` (drop = add = -1); a candidate is valid for a user when the added position exists among their eligible items."""
    n1 = min(n1, k)
    blocks = max(0, math.ceil((n_items - k) / n2))
    j = torch.arange(blocks * n1 * n2, device=n_eligible.device)
    block, rest = j // (n1 * n2), j % (n1 * n2)
    drop = torch.cat([j.new_full((1,), -1), k - 1 - rest // n2])
    add = torch.cat([j.new_full((1,), -1), k + block * n2 + rest % n2])
    valid = (add[None, :] < n_eligible[:, None]) | (add[None, :] < 0)
    return drop, add, valid


class BirthDeathChain:
    """The DTMC of Sec. 4.2 (Eq. (34)) over candidates sorted by decreasing weight, per user.

    ``log_w``: ``[U, J]`` log target weights (``-inf`` pads users with fewer candidates), sorted in decreasing order
    along J. ``p_up[u, j] = lambda_j dt``, ``p_down[u, j] = mu_j dt``.
    """

    def __init__(self, log_w: torch.Tensor, dt: float | None = None) -> None:
        self.log_w = log_w
        valid = torch.isfinite(log_w)
        nxt_ok = torch.zeros_like(valid)
        nxt_ok[:, :-1] = valid[:, 1:]
        prv_ok = torch.zeros_like(valid)
        prv_ok[:, 1:] = valid[:, :-1]
        diff = torch.zeros_like(log_w)
        diff[:, :-1] = torch.where(nxt_ok[:, :-1], log_w[:, 1:] - log_w[:, :-1], torch.zeros_like(diff[:, :-1]))
        log_lam = torch.where(nxt_ok, diff / 2, torch.full_like(diff, _NEG_INF))  # log lambda_j
        log_mu = torch.full_like(diff, _NEG_INF)
        log_mu[:, 1:] = torch.where(prv_ok[:, 1:], -diff[:, :-1] / 2, log_mu[:, 1:])  # log mu_j, mu_0 = 0
        log_rate = torch.logaddexp(log_lam, log_mu)  # log(lambda_j + mu_j)
        log_us = log_rate.masked_fill(~valid, _NEG_INF).amax(1, keepdim=True)  # log U_s per user
        log_us = torch.where(torch.isfinite(log_us), log_us, torch.zeros_like(log_us))  # single-state chains
        if dt is None:
            log_dt = -log_us  # dt = 1/U_s: Eq. (36) holds with equality at the fastest state
        else:
            if not dt > 0:
                raise ConfigError(f"exponential_topk dt={dt} must be > 0 (or null for 1/U_s)")
            log_dt = torch.full_like(log_us, math.log(dt))
            if bool((log_us + log_dt > 1e-9).any()):
                raise ConfigError(f"exponential_topk dt={dt} violates Eq. (36) (lambda+mu)*dt <= 1; use dt=null (1/U_s)")
        self.log_dt = log_dt
        self.p_up = (log_lam + log_dt).exp()
        self.p_down = (log_mu + log_dt).exp()

    def stationary(self) -> torch.Tensor:
        """Target law ``[U, J]``: ``pi_j ∝ w_j`` (Eq. (28) restricted to the candidates)."""
        return torch.softmax(self.log_w, dim=1)

    def step(self, state: torch.Tensor, generator: SecretGenerator) -> torch.Tensor:
        """One DTMC transition for every chain (``state``: ``[U]`` long)."""
        up = self.p_up.gather(1, state[:, None]).squeeze(1)
        down = self.p_down.gather(1, state[:, None]).squeeze(1)
        u = generator.rand(state.shape, dtype=torch.float64, device=state.device)
        return state + (u < up).long() - ((u >= up) & (u < up + down)).long()

    def run(self, n_iter: int, generator: SecretGenerator, state: torch.Tensor | None = None) -> torch.Tensor:
        """``n_iter`` transitions from ``S_0`` (or ``state``); returns the final states."""
        if state is None:
            state = torch.zeros(self.log_w.shape[0], dtype=torch.long, device=self.log_w.device)
        for _ in range(int(n_iter)):
            state = self.step(state, generator)
        return state


def window_chain(scores: torch.Tensor, eligible: torch.Tensor, k: int, epsilon: float, sensitivity: float, n1: int, n2: int,
                 dt: float | None = None) -> tuple[BirthDeathChain, torch.Tensor]:
    """The Sec. 4.4 candidates and the Sec. 4.2 chain for each user row: the chain and ``members`` (``[U, J, k]`` item
    ids of each sorted candidate set)."""
    logw_items = topk_log_weights(scores, eligible, epsilon, sensitivity)
    n_users, n_items = scores.shape
    order = torch.argsort(logw_items, dim=1, descending=True, stable=True)  # sorted positions -> items
    sorted_w = logw_items.gather(1, order)
    n_elig = eligible.sum(1)
    drop, add, valid = window_candidates(n_elig, k, n1, n2, n_items)
    top = sorted_w[:, :k].sum(1, keepdim=True)
    d, a = drop.clamp_min(0), add.clamp(0, n_items - 1)
    log_w = top - sorted_w[:, d] + sorted_w[:, a]  # log w(S_j) = eps f(S_j) / (2 Delta)
    log_w[:, 0] = top[:, 0]
    log_w = log_w.masked_fill(~valid, _NEG_INF)
    log_w, perm = torch.sort(log_w, dim=1, descending=True, stable=True)  # Prop. 4.1's ordering
    # members of each candidate: the top-k positions with position `drop` replaced by `add`
    pos = torch.arange(k, device=scores.device).expand(drop.numel(), k).clone()
    swap = drop >= 0
    pos[swap, drop[swap]] = add[swap]
    pos = pos.clamp_max(n_items - 1)
    members = order.gather(1, pos.reshape(1, -1).expand(n_users, -1)).reshape(n_users, -1, k)
    members = members.gather(1, perm[:, :, None].expand(-1, -1, k))
    return BirthDeathChain(log_w, dt), members


#: What the epsilon protects: one entry of ONE user's score row C_i, never a training rating (a rating moves many entries
#: of C). Its first word is not ``user``/``rating``, so the privacy ledger charges it as no training-data guarantee at all.
SCORE_ENTRY_RELATION = ("score-entry (C_i and C'_i differ in one entry of one user's score row; "
                        "not a training rating, not a user)")


# ----------------------------------------------------------- the mechanism
class ExponentialTopK:
    """Config object for ``mechanism=exponential_topk``; :meth:`wrap` gives a private ``recommend``.

    ``sampler``: ``exact``, ``mcmc`` (Sec. 4.2 chain on Sec. 4.4 windows) or ``auto`` (the default: exact unless the
    catalogue exceeds ``max_exact_items``).
    ``sensitivity``: ``Delta`` of one score entry; ``null`` = width of the predictor's score range.
    """

    def __init__(self, epsilon: float, seed: int | None = None, sampler: str = "auto", sensitivity: float | None = None,
                 n1: int = 2, n2: int = 3, n_iter: int = 5000, dt: float | None = None, max_exact_items: int = 200_000) -> None:
        self.epsilon = check_epsilon(epsilon, "exponential_topk")
        if sampler not in ("auto", "exact", "mcmc"):
            raise ConfigError(f"exponential_topk sampler={sampler!r}; choose exact, mcmc or auto")
        if sensitivity is not None and not sensitivity > 0:
            raise ConfigError(f"exponential_topk sensitivity={sensitivity} must be > 0 or null (score range)")
        for key, val in (("n1", n1), ("n2", n2), ("n_iter", n_iter)):
            if int(val) != val or val < 1:
                raise ConfigError(f"exponential_topk {key}={val} must be an integer >= 1")
        if dt is not None and not dt > 0:
            raise ConfigError(f"exponential_topk dt={dt} must be > 0 (or null for 1/U_s)")
        self.seed = None if seed is None else int(seed)  # None: secret noise (seeding.py)
        self.sampler, self.dt, self.max_exact_items = sampler, dt, int(max_exact_items)
        self.sensitivity = None if sensitivity is None else float(sensitivity)
        self.n1, self.n2, self.n_iter = int(n1), int(n2), int(n_iter)

    def wrap(self, predictor: Any) -> "ExponentialTopKRecommender":
        if not isinstance(predictor, (Scorer, Predictor)):
            raise ConfigError(f"mechanism=exponential_topk needs a model with score(users) or predict(); "
                              f"{type(predictor).__name__} has neither")
        return ExponentialTopKRecommender(predictor, self)


class ExponentialTopKRecommender:
    """A fitted scorer whose ``recommend(users, n)`` samples each user's set from Eq. (28)."""

    task = "topn"

    def __init__(self, predictor: Any, mechanism: ExponentialTopK) -> None:
        self.predictor, self.mech = predictor, mechanism
        label = predictor.name if isinstance(predictor, FittedPredictor) else type(predictor).__name__
        self.name = f"{label}+exponential_topk"
        self.generator_: SecretGenerator | None = None
        self.n_sets_ = 0
        self.n_items: int | None = None
        self.sensitivity_: float | None = mechanism.sensitivity
        self.range_: tuple[float, float] | None = None  # the scores' clipping range, set by fit()
        self.draws_ = torch.zeros(0, dtype=torch.long)  # released sets per user (the accountant)

    def fit(self, train: Ratings) -> "ExponentialTopKRecommender":
        self.predictor.fit(train)
        self._bind(train)
        self.draws_ = torch.zeros(train.n_users, dtype=torch.long)
        return self

    def released_state(self) -> dict[str, Any]:
        """The curator's state: the wrapped scorer's fitted state (not covered by epsilon: keep it private) and the
        sets released so far per user (the accountant). Never the sampler's generator."""
        if not isinstance(self.predictor, ReleasesState):
            raise ConfigError(f"exponential_topk: {type(self.predictor).__name__} cannot be written as a release")
        return {"predictor": self.predictor.released_state(), "draws": self.draws_, "n_sets": int(self.n_sets_)}

    def restore(self, train: Ratings, state: dict[str, Any]) -> "ExponentialTopKRecommender":
        """The wrapped scorer from ``state["predictor"]`` and the per-user count of released sets (the epsilon keeps
        composing); every later set is sampled afresh."""
        if not isinstance(self.predictor, ReleasesState):
            raise ConfigError(f"exponential_topk: {type(self.predictor).__name__} cannot be restored from a release")
        self.predictor.restore(train, state["predictor"])
        self._bind(train)
        self.draws_, self.n_sets_ = state["draws"].cpu().long(), int(state["n_sets"])
        self.generator_ = None
        return self

    def _bind(self, train: Ratings) -> None:
        """The item count, the rated items (never recommended) and the score range's Delta (public: the scale)."""
        self.n_items = train.n_items
        self.indicator_ = train.indicator_csr()
        self.range_ = (tuple(float(x) for x in self.predictor.score_range()) if hasattr(self.predictor, "score_range")
                       else (float(train.scale.lo), float(train.scale.hi)))  # any scorer may declare one (no shared base)
        width = self.range_[1] - self.range_[0]
        if not (math.isfinite(width) and width >= 0):
            raise ConfigError(f"exponential_topk: the score range {self.range_} must be finite (lo <= hi): it bounds "
                              "the change of one score entry")
        self.sensitivity_ = self.mech.sensitivity if self.mech.sensitivity is not None else width
        if not self.sensitivity_ > 0:
            raise ConfigError(f"exponential_topk: the score range {self.range_} has zero width; pass sensitivity > 0")
        if self.sensitivity_ < width:
            # one clipped score entry moves f(S) by up to the range width: a smaller Delta overstates epsilon
            raise ConfigError(f"exponential_topk: sensitivity={self.sensitivity_:g} is below the width {width:g} of the "
                              f"score range {self.range_}; use sensitivity=null (= the width) or a value >= {width:g}")

    @property
    def sampler(self) -> str:
        if self.mech.sampler == "auto":
            return "exact" if (self.n_items or 0) <= self.mech.max_exact_items else "mcmc"
        return self.mech.sampler

    def scores(self, users: torch.Tensor) -> torch.Tensor:
        """``[U, M]`` scores from ``score(users)`` or ``predict`` over all items, clipped to the range (NaN -> lo)."""
        if isinstance(self.predictor, Scorer):
            s = self.predictor.score(users)
        else:
            n_u = users.numel()
            items = torch.arange(self.n_items, device=users.device)
            s = self.predictor.predict(users.repeat_interleave(self.n_items), items.repeat(n_u)).reshape(n_u, self.n_items)
        # NaN -> lo and +-inf -> the range ends: any value of one entry stays within the Delta it was calibrated to
        return s.double().nan_to_num(nan=self.range_[0]).clamp(*self.range_)

    def _gen(self, device: torch.device) -> SecretGenerator:
        if self.generator_ is None:
            self.generator_ = noise_generator(self.mech.seed, device)
        return self.generator_

    def recommend(self, users: torch.Tensor, n: int) -> torch.Tensor:
        """A private set of ``n`` unrated items per user (ids ascending -- the order carries no
        information beyond the set), ``-1`` padded where fewer than ``n`` items are unrated."""
        if int(n) != n or n < 1:
            raise ConfigError(f"recommend n={n} must be an integer >= 1")
        n = int(n)
        if self.n_items is None:
            raise RuntimeError("ExponentialTopKRecommender.recommend called before fit()")
        users = torch.as_tensor(users, dtype=torch.long)
        if bool(((users < 0) | (users >= self.indicator_.shape[0])).any()):
            raise DataError(f"recommend: user ids must lie in [0, {self.indicator_.shape[0]})")
        out = []
        for start in range(0, users.numel(), _BLOCK):
            blk = users[start : start + _BLOCK]
            scores = self.scores(blk)
            eligible = dense_rows(self.indicator_, blk.to(self.indicator_.device)).to(scores.device) == 0
            out.append(self._sample(scores, eligible, n))
        self.n_sets_ += users.numel()
        self.draws_ += torch.bincount(users.cpu(), minlength=self.draws_.numel())  # per-user composition
        return torch.cat(out) if out else torch.empty(0, n, dtype=torch.long)

    def _sample(self, scores: torch.Tensor, eligible: torch.Tensor, n: int) -> torch.Tensor:
        if math.isinf(self.mech.epsilon):  # non-private: the true top-n
            vals, idx = torch.topk(scores.masked_fill(~eligible, _NEG_INF), min(n, scores.shape[1]), dim=1)
            chosen = torch.zeros_like(eligible).scatter_(1, idx, torch.isfinite(vals))
        elif self.sampler == "exact":
            logw = topk_log_weights(scores, eligible, self.mech.epsilon, self.sensitivity_)
            chosen = sample_topk_exact(logw, n, self._gen(scores.device))
        else:
            mech = self.mech
            chain, members = window_chain(scores, eligible, n, mech.epsilon, self.sensitivity_, mech.n1, mech.n2, mech.dt)
            state = chain.run(self.mech.n_iter, self._gen(scores.device))
            sets = members.gather(1, state[:, None, None].expand(-1, 1, n)).squeeze(1)
            chosen = torch.zeros_like(eligible).scatter_(1, sets, True) & eligible
        return mask_to_ids(chosen, n)

    def privacy_report(self) -> dict[str, Any]:
        """Relation (one score entry), sensitivity (of the utility f), noise (the sampler) and accountant (basic
        composition of one user's draws; parallel across users). Checked by the harness case ``exponential_topk``."""
        exact = self.sampler == "exact" or math.isinf(self.mech.epsilon)
        per_set = self.mech.epsilon if exact else None
        most = int(self.draws_.max()) if self.draws_.numel() else 0
        eps = None if per_set is None else per_set * max(most, 1)  # k draws for one user: k eps (0 or 1 draw: eps)
        base = (
            f"Exponential mechanism (Theorem 2.2 with phi = exp(f/Delta), Prop. 4.2, exponent eps/2, Eq. (28)), "
            f"utility f(S) = sum of the user's clipped scores over S, Delta = {self.sensitivity_}. "
            "The unit is one entry of C, not one training rating: a training rating can move many entries of C, "
            "so training-data privacy needs a private scorer underneath."
        )
        analysis = base + (" Sampled exactly (elementary-symmetric-polynomial DP), so the epsilon is exact." if exact else
                           " sampler=mcmc gives NO epsilon: the Sec. 4.4 candidates depend on C's ranking, so a neighbouring C' "
                           "has sets of zero probability under C, and a finite chain is not at stationarity.")
        rng = self.range_
        return {
            "mechanism": "exponential_topk", "relation": SCORE_ENTRY_RELATION,
            "unit": "one entry of the user's score row C_i (Sec. 4.1 dynamic attack)",
            "neighbouring": "C, C' differ in one entry; training data and the excluded (rated) items are fixed",
            "sensitivity": self.sensitivity_,
            "sensitivity_of": (f"f(S) = sum_(j in S) clip(c_ij, {rng[0]:g}, {rng[1]:g}): one entry moves f(S) of any set "
                               f"by at most the range width {rng[1] - rng[0]:g} <= Delta") if rng else None,
            "noise": f"P(S) ∝ exp(eps f(S) / (2*{self.sensitivity_})) over n-subsets of unrated items, sampler={self.sampler}",
            "sampler": self.sampler,
            "accountant": ("pure-DP basic composition over the sets released for one user (epsilon = epsilon_per_set x "
                           "the most sets any one user received, at least 1); users' score rows are disjoint (parallel "
                           "composition)") if exact else "none (sampler=mcmc has no epsilon)",
            "epsilon": eps, "epsilon_per_set": per_set, "epsilon_nominal": self.mech.epsilon,
            "epsilon_scope": ("epsilon: composed over the sets released to one user so far (epsilon_per_set: one set); "
                              "users use disjoint rows of C (parallel composition)"),
            "released_sets": self.n_sets_, "max_sets_per_user": most, "delta": 0.0, "analysis": analysis,
        }


def mask_to_ids(chosen: torch.Tensor, n: int) -> torch.Tensor:
    """``[U, M]`` bool mask -> ``[U, n]`` item ids ascending, ``-1`` padded."""
    n_items = chosen.shape[1]
    ids = torch.where(chosen, torch.arange(n_items, device=chosen.device), torch.full_like(chosen, n_items, dtype=torch.long))
    ids = torch.sort(ids, dim=1).values[:, : min(n, n_items)]
    ids = ids.masked_fill(ids == n_items, -1)
    if ids.shape[1] < n:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], n - ids.shape[1]), -1)], dim=1)
    return ids
