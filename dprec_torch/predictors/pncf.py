"""PNCF: Private Neighbor Collaborative Filtering (Zhu et al., ASONAM 2013, as described by Sun).

Source: ``shared/papers/sun-pncf-private-neighbor-cf.txt`` (Alg. 1, Alg. 2, Sec. 3.1-3.2); the garbled equations read as:

* Similarity (Zhu's item-based PCC over co-raters U_ij)::

      s(i, j) = sum_x a_xi a_xj / sqrt(sum_x a_xi^2 * sum_x a_xj^2),  x in U_ij,  a_xi = r_xi - rbar_i

  optionally shrunk by support, ``s * n_ij / (n_ij + shrinkage)`` (our addition, 0 = the paper). User-based PNCF is
  the same with users and items swapped (a_xa = r_ax - rbar_a).
* Recommendation-aware sensitivity (Sec. 3.1 A): ``RS(i, j) = max_x |s(i, j) - s_{-x}(i, j)|``, the largest change of
  the similarity when one rating record of a co-rater ``x`` is deleted (means held fixed, as in Zhu). Alg. 2 line 5
  writes ``RS(i, j)`` in the exponent but puts all of C0 behind one factor ``|C0| exp(...)`` (one bound per target);
  Alg. 1 line 3 writes ``LS(i, .)``. We use the row bound ``RS_i = max_j RS(i, j)``: an exponential mechanism needs one
  sensitivity for all candidates' scores. The "smooth bound" ``B(RS) = exp(-beta) RS`` is not implemented: scaling a
  local sensitivity down is not a smooth upper bound and would only hide noise.
* Truncated similarity (Sec. 3.1 A): ``s_hat(i, j) = max(s(i, j), s_k(i) - w)`` with ``s_k(i)`` the k-th largest
  similarity of row i. Alg. 2 line 2: ``C1 = {j : s(i, j) >= s_k(i) - w}``, ``C0`` the rest. ``w=None`` uses
  ``w_i = max(s_k(i), 0)``, i.e. everything below 0 is truncated to 0 (the cap on w).
* Alg. 2 lines 3-8: k rounds; in each, candidate j (not yet chosen) has probability
  ``exp(eps s_hat / (4k RS_i)) / (sum_{C1} exp(...) + |C0| exp(eps (s_k - w) / (4k RS_i)))``, i.e. an exponential
  mechanism at eps/(2k) per round (score sensitivity RS_i), sampled without replacement.
* Perturbation: ``perturb="similarity"`` adds Laplace noise to the k selected similarities. Alg. 1 line 3 writes
  ``Lap(2k LS(i,.)/eps)``; Sec. 3.1 B writes ``Lap(2 RS/eps)``. Only the former makes the k values together eps/2
  (each similarity can move by RS_i under one deletion), so it is the default (``perturb_scale="alg1"``);
  ``"section_b"`` reproduces the other reading. ``perturb="rating"`` (Sun's variant) instead adds
  ``Lap(2 (r_max - r_min)/eps)`` once to every training rating deviation used in predictions.
* Prediction (Alg. 1 line 4, item-based):
  ``r_ai = rbar_i + sum_{j in N_k(i) cap R_a} s~_ij (r_aj - rbar_j) / sum |s~_ij|``, falling back to ``rbar_i`` when
  the user rated none of the k neighbours.

Privacy, stated exactly: relation = one rating (deletion). Per target the paper claims eps/2 (selection, k rounds x
eps/(2k), sequential composition) + eps/2 (perturbation) = eps. That claim holds only if RS_i were a *global* bound;
it is a data-dependent local sensitivity, for which the exponential and Laplace mechanisms are not eps-DP in general.
Moreover every rating enters the similarity rows of many targets and the (unperturbed) means, so the per-target
budgets compose over all targets. No end-to-end epsilon is therefore claimed (``privacy_report()["epsilon"] = inf``);
the per-target value is reported as ``epsilon_nominal``. ``epsilon=inf`` gives non-private kNN: the top-k neighbours
by similarity, no noise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings, dense_rows
from dprec_torch.errors import ConfigError
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.predictors.base import BasePredictor, query_ids
from dprec_torch.predictors.release import fallback_release
from dprec_torch.seeding import SecretGenerator, noise_generator

log = logging.getLogger(__name__)

#: the noise stream of per-query draws (selection and similarity perturbation); stream 0 is the rating variant's
QUERY_STREAM = 1

_TRIPLES_PER_CHUNK = 4_000_000  # bounds memory of the RS pass (~100 MB of temporaries)


# ---------------------------------------------------------------- similarity and RS
def _sparse(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, shape, check_invariants=False).coalesce()


def pcc_statistics(ent: torch.Tensor, oth: torch.Tensor, dev: torch.Tensor, n_ent: int, n_oth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse Gram products over co-raters: ``num[i,j] = sum_x a_xi a_xj``, ``sq[i,j] = sum_{x in U_ij} a_xi^2``, ``n[i,j] = |U_ij|``,
    all dense ``n_ent x n_ent``. ``ent``/``oth`` index the entity compared (items for item-based) and the co-rater
    (users); ``dev`` holds the centred values ``a``."""
    one = torch.ones_like(dev)
    x = _sparse(oth, ent, dev, (n_oth, n_ent))
    x2 = _sparse(oth, ent, dev * dev, (n_oth, n_ent))
    ind = _sparse(oth, ent, one, (n_oth, n_ent))
    num = torch.sparse.mm(x.t().coalesce(), x).to_dense()
    sq = torch.sparse.mm(x2.t().coalesce(), ind).to_dense()
    support = torch.sparse.mm(ind.t().coalesce(), ind).to_dense()
    return num, sq, support


def pcc_from_statistics(num: torch.Tensor, sq_i: torch.Tensor, sq_j: torch.Tensor, support: torch.Tensor, shrinkage: float) -> torch.Tensor:
    """PCC over co-raters (0 where undefined), times the support shrinkage ``n / (n + shrinkage)``."""
    den = sq_i * sq_j
    ok = den > 1e-12
    s = torch.where(ok, num / den.clamp_min(1e-12).sqrt(), torch.zeros_like(num))
    s = s.clamp(-1.0, 1.0)  # rounding can push |s| a hair above 1
    if shrinkage > 0:
        s = s * support / (support + shrinkage)
    return s


def row_sensitivity(ent: torch.Tensor, oth: torch.Tensor, dev: torch.Tensor, n_ent: int, n_oth: int,
                    num: torch.Tensor, sq: torch.Tensor, support: torch.Tensor, shrinkage: float) -> torch.Tensor:
    """``RS_i = max_j max_{x in U_ij} |s(i,j) - s_{-x}(i,j)|`` for every entity i (Sec. 3.1 A, row bound), over every
    (co-rater x, entity i, entity j) triple with both ratings present, batched over chunks of records (no per-user
    loop): sum over x of |R_x|^2 triples in total."""
    order = torch.argsort(oth * n_ent + ent)
    ent, oth, dev = ent[order], oth[order], dev[order]
    counts = torch.bincount(oth, minlength=n_oth)
    crow = torch.zeros(n_oth + 1, dtype=torch.long, device=ent.device)
    crow[1:] = torch.cumsum(counts, 0)
    per_entry = counts[oth]  # partners of each record (itself included)
    ends = torch.cumsum(per_entry, 0)
    rs = torch.zeros(n_ent, dtype=num.dtype, device=num.device)
    start, nnz = 0, ent.numel()
    while start < nnz:  # a handful of chunks, each fully vectorised
        base = int(ends[start - 1]) if start > 0 else 0
        stop = int(torch.searchsorted(ends, torch.tensor(base + _TRIPLES_PER_CHUNK, device=ends.device), right=True))
        stop = max(stop, start + 1)
        e = torch.arange(start, stop, device=ent.device)
        cnt = per_entry[e]
        idx = torch.repeat_interleave(e, cnt)
        first = torch.repeat_interleave(torch.cumsum(cnt, 0) - cnt, cnt)
        partner = crow[oth[idx]] + (torch.arange(idx.numel(), device=ent.device) - first)
        keep = partner != idx
        idx, partner = idx[keep], partner[keep]
        i, j = ent[idx], ent[partner]
        ai, aj = dev[idx], dev[partner]
        n_ij, a_ij, b_ij, c_ij = num[i, j], sq[i, j], sq[j, i], support[i, j]
        s = pcc_from_statistics(n_ij, a_ij, b_ij, c_ij, shrinkage)
        s_minus = pcc_from_statistics(n_ij - ai * aj, (a_ij - ai * ai).clamp_min(0), (b_ij - aj * aj).clamp_min(0), c_ij - 1, shrinkage)
        rs.scatter_reduce_(0, i, (s - s_minus).abs(), reduce="amax")
        start = stop
    return rs


# --------------------------------------------------------- Alg. 2: private selection
def truncated_scores(sim: torch.Tensor, k: int, w: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Alg. 2 lines 1-2 over the last dimension: truncated scores ``max(s, s_k - w)``, the floors ``s_k - w`` and the
    C1 mask. ``sim`` must carry ``-inf`` on non-candidates (the target itself, items the active user did not rate);
    rows need at least ``k`` candidates."""
    s_k = torch.topk(sim, k, dim=-1).values[..., -1]
    w_row = s_k.clamp_min(0.0) if w is None else torch.full_like(s_k, float(w))
    floor = s_k - w_row
    in_c1 = sim >= floor[..., None]
    scores = torch.maximum(sim, floor[..., None])
    return scores, floor, in_c1


def round_probabilities(scores: torch.Tensor, available: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Alg. 2 line 5: ``P(j) = exp(coef s_hat_j) / sum_{available} exp(coef s_hat)`` with ``coef = eps/(4k RS_i)``;
    C0 members share the floor score, so their total mass is ``|C0| exp(coef (s_k - w)) / Z`` as in the paper."""
    return torch.softmax((coef[..., None] * scores).masked_fill(~available, float("-inf")), dim=-1)


def private_neighbours(sim: torch.Tensor, rs: torch.Tensor, k: int, epsilon: float, w: float | None, gen: SecretGenerator) -> torch.Tensor:
    """Alg. 2 for every row of ``sim`` (``[..., L]``, ``-inf`` = not a candidate) at once: k rounds of the exponential
    mechanism at eps/(2k), without replacement; returns the ``[..., k]`` picked positions. The k rounds are drawn in
    one pass by the Gumbel-top-k trick: the k largest of ``logit_j + G_j`` (G_j iid Gumbel(0, 1)) are distributed
    exactly as k successive softmax draws without replacement (Plackett-Luce; Vieira 2014, Kool et al. 2019). A row
    with at most k candidates picks all of them; its remaining positions point at non-candidates (``-inf`` in ``sim``).
    """
    n_cand = torch.isfinite(sim).sum(-1)
    kk = min(k, sim.shape[-1])
    # rows with fewer than k candidates: pad their k-th value so truncated_scores is defined (they take all)
    padded = torch.where((n_cand[..., None] < kk) & ~torch.isfinite(sim), torch.full_like(sim, -1e9), sim)
    scores, _, _ = truncated_scores(padded, kk, w)
    coef = torch.where(rs > 0, epsilon / (4.0 * k * rs.clamp_min(1e-12)), torch.zeros_like(rs))
    logits = (coef[..., None] * scores).masked_fill(~torch.isfinite(sim), float("-inf"))
    u = gen.rand(sim.shape, device=sim.device, dtype=torch.float64).clamp_(1e-300, 1.0)
    gumbel = -torch.log(-torch.log(u)).to(sim.dtype)
    keys = torch.where(torch.isfinite(logits), logits + gumbel, torch.full_like(logits, float("-inf")))
    return torch.topk(keys, kk, dim=-1).indices


def laplace(shape: tuple[int, ...], scale: torch.Tensor | float, gen: SecretGenerator, device: torch.device) -> torch.Tensor:
    """Laplace(0, scale) draws by inverse CDF from an explicit generator."""
    u = gen.rand(shape, device=device, dtype=torch.float64) - 0.5
    x = -torch.sign(u) * torch.log1p(-2.0 * u.abs())
    return (x * torch.as_tensor(scale, dtype=torch.float64, device=device)).to(torch.float32)


@dataclass
class Neighbourhoods:
    """The neighbours chosen for a batch of queries (Alg. 1 lines 2-3), ``[Q, k]`` each. ``entity``: the neighbour ids
    (items for item-based, users for user-based), all rated by / raters of the query's counterpart; ``sim``: their true
    similarity to the target; ``released``: the similarity used in the prediction (``sim`` plus the perturbation noise);
    ``dev``: the neighbour's centred rating; ``valid``: False on padding (fewer than k candidates)."""

    entity: torch.Tensor
    sim: torch.Tensor
    released: torch.Tensor
    dev: torch.Tensor
    valid: torch.Tensor


# ------------------------------------------------------------------------ predictor
class PNCF(BasePredictor):
    """Private Neighbor CF (Alg. 1): per query, private neighbour selection among what the active user rated
    (item-based) or among the raters of the target item (user-based), then Laplace perturbation.

    Args:
        epsilon: the per-query budget of the paper (``inf`` = non-private kNN, same class).
        k: neighbours per query (Alg. 2 rounds).
        mode: ``"item"`` (neighbours of the target item among the user's rated items) or ``"user"``
            (neighbours of the active user among the target item's raters; Sun's evaluation).
        perturb: ``"similarity"`` (the paper) or ``"rating"`` (Sun's variant).
        w: truncation parameter; ``None`` uses ``max(s_k, 0)`` per query (Sun's experiments: 0.01).
        perturb_scale: ``"alg1"`` = ``Lap(2k RS_i/eps)`` (Alg. 1 line 3), ``"section_b"`` = ``Lap(2 RS_i/eps)``.
        shrinkage: support shrinkage of the similarity (0 = plain PCC as in the paper).
        seed: seeds the generator of selection and noise (None: secret, from the OS entropy source) (drawn afresh for every query answered).
    """

    name = "pncf"
    task = "both"
    #: query cells (queries x candidates) scored per batch: bounds predict's working memory
    cell_budget = 1 << 22

    def __init__(self, epsilon: float = 1.0, k: int = 5, mode: str = "item", perturb: str = "similarity",
                 w: float | None = None, perturb_scale: str = "alg1", shrinkage: float = 0.0, seed: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(device)
        self.epsilon = check_epsilon(epsilon, "pncf")
        if int(k) != k or k < 1:
            raise ConfigError(f"pncf: k={k} must be a positive integer")
        for key, value, allowed in (("mode", mode, ("item", "user")), ("perturb", perturb, ("similarity", "rating")),
                                    ("perturb_scale", perturb_scale, ("alg1", "section_b"))):
            if value not in allowed:
                raise ConfigError(f"pncf: {key}={value!r} is unknown; use {' or '.join(allowed)}")
        if w is not None and not float(w) >= 0:
            raise ConfigError(f"pncf: w={w} must be >= 0 (or null for max(s_k, 0))")
        if not float(shrinkage) >= 0:
            raise ConfigError(f"pncf: shrinkage={shrinkage} must be >= 0")
        self.k, self.mode, self.perturb, self.perturb_scale = int(k), mode, perturb, perturb_scale
        self.w, self.shrinkage = None if w is None else float(w), float(shrinkage)
        self.seed = None if seed is None else int(seed)  # None: secret noise (seeding.py)
        self.rs_: torch.Tensor | None = None  # learned in fit: RS_i per entity

    # ------------------------------------------------------------------ fit
    def _orient(self, r: Ratings) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """(entity, other) ids: entities are compared, others are the co-raters."""
        if self.mode == "item":
            return r.items, r.users, r.n_items, r.n_users
        return r.users, r.items, r.n_users, r.n_items

    def fit(self, train: Ratings) -> "PNCF":
        """Similarities and RS (Alg. 1 line 1); the rating variant's noise. Neighbours are chosen per query."""
        train = self._prepare(train, require_ratings=True)
        ent, oth, n_ent, n_oth = self._orient(train)
        # two noise streams: the rating variant's fit-time noise (stream 0) and the per-query draws (stream 1), so a
        # restored predictor's queries never replay the fit-time draws (with an explicit seed they replay the queries')
        self.gen_ = noise_generator(self.seed, train.device, stream=QUERY_STREAM, private=self.private)
        self.means_ = train.item_means() if self.mode == "item" else train.user_means()
        dev = train.values - self.means_[ent]
        num, sq, support = pcc_statistics(ent, oth, dev, n_ent, n_oth)
        self.sim_ = pcc_from_statistics(num, sq, sq.t(), support, self.shrinkage)
        self.rs_ = (row_sensitivity(ent, oth, dev, n_ent, n_oth, num, sq, support, self.shrinkage) if self.private
                    else torch.zeros(n_ent, device=self.sim_.device))
        if self.noisy_deviations:
            gen = noise_generator(self.seed, train.device, private=self.private)
            dev = dev + laplace(tuple(dev.shape), 2.0 * train.scale.span / self.epsilon, gen, dev.device)
        self._index_candidates(train, dev)
        log.info("pncf(%s, k=%d, eps=%g): RS_i in [%.3g, %.3g]", self.mode, self.k, self.epsilon, float(self.rs_.min()), float(self.rs_.max()))
        return self

    @property
    def noisy_deviations(self) -> bool:
        """Sun's variant: every training deviation carries Laplace noise drawn once in ``fit``."""
        return self.private and self.perturb == "rating"

    def _index_candidates(self, train: Ratings, dev: torch.Tensor) -> None:
        """The candidates of a query -- the entities linked to its counterpart -- as a CSR over ``oth``, with their
        centred ratings ``dev`` (aligned with ``train``)."""
        ent, oth, n_ent, n_oth = self._orient(train)
        order = torch.argsort(oth * n_ent + ent)
        counts = torch.bincount(oth, minlength=n_oth)
        self.crow_ = torch.zeros(n_oth + 1, dtype=torch.long, device=train.device)
        self.crow_[1:] = torch.cumsum(counts, 0)
        self.cand_, self.cand_dev_, self.cand_counts_ = ent[order], dev[order], counts
        self.n_ent_, self.n_oth_ = n_ent, n_oth
        self.train_ = train

    # ------------------------------------------------------------ release
    def released_state(self) -> dict[str, Any]:
        """The curator's state (no end-to-end epsilon; every query draws afresh): similarities, RS_i, the means, the
        fallback; with ``perturb=rating`` the noisy deviations (drawn once in ``fit``), aligned with the training
        ratings sorted by (counterpart, entity). Never the generator."""
        fb = self._check_fitted()
        state = {"n_items": int(self.train_.n_items), "similarity": self.sim_, "row_sensitivity": self.rs_,
                 "means": self.means_, "fallback": fallback_release(fb)}
        if self.noisy_deviations:
            state["noisy_deviations"] = self.cand_dev_
        return state

    def restore(self, train: Ratings, state: dict[str, Any]) -> "PNCF":
        """Similarities, RS_i and the means from ``state``; the candidates from ``train``. Queries draw from a fresh
        generator (secret, or stream 1 of an explicit seed: the first queries then repeat those of the fitted run)."""
        train = self._prepare(train, state)
        self.gen_ = noise_generator(self.seed, train.device, stream=QUERY_STREAM, private=self.private)
        self.sim_, self.rs_ = state["similarity"].to(train.device), state["row_sensitivity"].to(train.device)
        self.means_ = state["means"].to(train.device)
        ent, _, _, _ = self._orient(train)
        self._index_candidates(train, train.values - self.means_[ent])
        if self.noisy_deviations:
            released = state["noisy_deviations"].to(train.device)
            if released.shape != self.cand_dev_.shape:
                raise ConfigError(f"pncf: the release holds {released.numel()} noisy deviations, the training split "
                                  f"{self.cand_dev_.numel()} ratings; load it with the data it was fitted on")
            self.cand_dev_ = released
        return self

    # -------------------------------------------------------------- select
    def _select_block(self, tgt: torch.Tensor, oth: torch.Tensor) -> Neighbourhoods:
        """Alg. 2 + Alg. 1 line 3 for queries ``[Q]`` (in-range ids) sharing one padded candidate width."""
        lens = self.cand_counts_[oth]
        width = max(int(lens.max()) if lens.numel() else 0, 1)
        ar = torch.arange(width, device=tgt.device)
        pos = (self.crow_[oth][:, None] + ar[None, :]).clamp_max(max(self.cand_.numel() - 1, 0))
        cand, cdev = self.cand_[pos], self.cand_dev_[pos]
        ok = (ar[None, :] < lens[:, None]) & (cand != tgt[:, None])  # the target is not its own neighbour
        sim = self.sim_[tgt[:, None], cand]
        masked = sim.masked_fill(~ok, float("-inf"))
        if self.private:
            pick = private_neighbours(masked, self.rs_[tgt], self.k, self.epsilon, self.w, self.gen_)
        else:
            pick = torch.topk(masked, min(self.k, width), dim=1).indices
        valid = ok.gather(1, pick)
        s = sim.gather(1, pick)
        released = s
        if self.private and self.perturb == "similarity":
            factor = 2.0 * self.k if self.perturb_scale == "alg1" else 2.0
            released = s + laplace(tuple(s.shape), (factor * self.rs_[tgt] / self.epsilon)[:, None], self.gen_, s.device)
        return Neighbourhoods(cand.gather(1, pick), s, released, cdev.gather(1, pick), valid)

    def _blocks(self, oth: torch.Tensor) -> list[torch.Tensor]:
        """Query positions in batches of similar candidate width (sorted by width): each batch's queries x its widest
        candidate list stays within ``cell_budget``."""
        widths, order = torch.sort(self.cand_counts_[oth].clamp_min(1), stable=True)
        blocks, start, n = [], 0, order.numel()
        while start < n:
            cost = torch.arange(1, n - start + 1, device=widths.device) * widths[start:]  # non-decreasing
            stop = start + max(1, int(torch.searchsorted(cost, torch.tensor(self.cell_budget, device=cost.device), right=True)))
            blocks.append(order[start:stop])
            start = stop
        return blocks

    def select(self, users: torch.Tensor, items: torch.Tensor) -> Neighbourhoods:
        """The neighbourhood of every query (in-range ids): private selection among its candidates (Alg. 2) and the
        perturbed similarities (Alg. 1 line 3). A fresh draw per call."""
        tgt, oth = (items, users) if self.mode == "item" else (users, items)
        q, kk = tgt.numel(), self.k
        out = Neighbourhoods(*(torch.zeros(q, kk, dtype=d, device=tgt.device) for d in (torch.long, torch.float32, torch.float32, torch.float32, torch.bool)))
        for idx in self._blocks(oth):
            nb = self._select_block(tgt[idx], oth[idx])
            w = nb.entity.shape[1]
            for name in ("entity", "sim", "released", "dev", "valid"):
                getattr(out, name)[idx, :w] = getattr(nb, name).to(getattr(out, name).dtype)
        return out

    # -------------------------------------------------------------- predict
    def _raw(self, users: torch.Tensor, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Alg. 1 line 4 for in-range ids: target mean + weighted neighbour deviations, and whether any
        selected neighbour carries weight (False: the prediction is the fallback)."""
        nb = self.select(users, items)
        s = nb.released * nb.valid
        wsum = s.abs().sum(1)
        num = (s * nb.dev).sum(1)
        base = self.means_[items if self.mode == "item" else users]
        usable = wsum > 0
        return torch.where(usable, base + num / wsum.clamp_min(1e-12), base), usable

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Predicted ratings, clipped; unknown users/items, and queries none of whose selected neighbours
        carries weight, get the item mean, then the global mean (counted in ``fallback_rate_``)."""
        self._check_fitted()
        users, items = query_ids(users, items, self.device, "pncf")
        raw, usable = self._raw(users.clamp(0, self.train_.n_users - 1), items.clamp(0, self.train_.n_items - 1))
        return self._finish_and_count(users, items, raw, usable)

    def recommend(self, users: torch.Tensor, n: int, batch: int = 64) -> torch.Tensor:
        """Top-n items by predicted rating, excluding the user's training items; -1 pads."""
        self._check_fitted()
        users = torch.as_tensor(users, dtype=torch.long, device=self.device)
        return _topn_by_score(self.predict, users, n, self.train_, batch)

    # -------------------------------------------------------------- privacy
    def privacy_report(self) -> dict[str, Any]:
        if not self.private:
            return {"mechanism": "none (PNCF at epsilon=inf: non-private top-k neighbour CF)", "relation": None, "sensitivity": None,
                    "noise": "none", "epsilon": float("inf"), "delta": 0.0, "analysis": "non-private"}
        rs = self.rs_
        rs_txt = "RS_i = max_j max_x |s(i,j) - s_-x(i,j)| (local, data-dependent)"
        if rs is not None:
            rs_txt += f"; observed range [{float(rs.min()):.3g}, {float(rs.max()):.3g}]"
        cands = "the active user's rated items" if self.mode == "item" else "the target item's raters"
        if self.perturb == "similarity":
            factor = "2k" if self.perturb_scale == "alg1" else "2"
            noise = (f"per query, among {cands}: exponential mechanism, {self.k} rounds at eps/(2k) with truncated scores "
                     f"(w={self.w}); Lap({factor}*RS_i/eps) on the {self.k} selected similarities")
            per_query = self.epsilon if self.perturb_scale == "alg1" else self.epsilon / 2 + self.k * self.epsilon / 2
        else:
            noise = (f"per query, among {cands}: exponential mechanism, {self.k} rounds at eps/(2k); "
                     f"Lap(2*{self.train_.scale.span:g}/eps) added once to every training rating deviation")
            per_query = self.epsilon
        return {
            "mechanism": f"PNCF ({self.mode}-based, perturb={self.perturb})", "relation": "rating", "sensitivity": rs_txt,
            "noise": noise, "epsilon": float("inf"), "epsilon_nominal": per_query, "delta": 0.0,
            "analysis": ("Per query (Alg. 1 for one (u_a, t_i)): k exponential-mechanism rounds at eps/(2k) plus Laplace perturbation, "
                         f"sequential composition (Sun Sec. 3.2 A) gives the nominal {per_query:g} per query only if RS_i were a global "
                         "bound. RS_i is a local (data-dependent) sensitivity, every query draws afresh (answers compose), each rating "
                         "feeds many similarity rows and the unperturbed means, so no end-to-end epsilon is claimed."),
        }


def _topn_by_score(score_fn: Any, users: torch.Tensor, n: int, train: Ratings, batch: int) -> torch.Tensor:
    """Score every item for batches of users, drop training items, keep the top n (-1 where nothing is left)."""
    if int(n) != n or n < 1:
        raise ConfigError(f"recommend: n={n} must be a positive integer")
    n_items = train.n_items
    n = min(int(n), n_items)
    indicator = train.indicator_csr()
    out = []
    items_all = torch.arange(n_items, device=users.device)
    for start in range(0, users.numel(), batch):  # batches of users, each vectorised over all items
        u = users[start:start + batch]
        scores = score_fn(u.repeat_interleave(n_items), items_all.repeat(u.numel())).reshape(u.numel(), n_items).double()
        rated = (dense_rows(indicator, u.clamp(0, train.n_users - 1)) > 0) & ((u >= 0) & (u < train.n_users))[:, None]
        top = torch.topk(scores.masked_fill(rated, float("-inf")), n, dim=1)
        out.append(torch.where(torch.isfinite(top.values), top.indices, torch.full_like(top.indices, -1)))
    return torch.cat(out) if out else torch.empty(0, n, dtype=torch.long, device=users.device)
