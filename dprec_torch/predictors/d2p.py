"""D2P: distance-based differential privacy via AlterEgo profiles (Guerraoui et al. 2015).

Source: ``shared/papers/guerraoui-2015-d2p-distance-based-dp.txt``. How the paper was read:

* Binary ratings (Sec. 2.1): like = rating >= ``lo + like_fraction * span`` (default 0.75: 4 on a 1..5 scale). A
  profile is the *set of liked items*; a dislike is a 0 entry and contributes nothing to cosine similarity or
  popularity, so it is not part of the released AlterEgo.
* Distance (Eq. 1, Alg. 1): ``lambda_ij = 1/cos(i, j) - 1`` for ``cos > 0`` (cosine of the items' binary like
  vectors), so ``j in GRP(i)`` iff ``cos(i, j) > 1/(1 + lambda)``; every item is in its own group.
* Neighbouring groups (Sec. 2.1.1, Alg. 3 lines 6-9): the groups sharing at least one item with GRP(i)
  (``neighbor_groups=None``), or the top-K of them by shared count (Def. 4, ``neighbor_groups=K``). ``G_lambda(i)`` =
  GRP(i) united with them (Sec. 3.2.3).
* Selector (Alg. 2): each item goes to RItems with probability p, else to GItems. The listing draws two independent
  numbers (an item could land in both or neither); we draw one, as the text and Sec. 3.2.3's analysis assume.
* Profiler (Alg. 3): keep the item with probability p*; otherwise replace a GItem by a uniform item of
  ``G_lambda(s)`` and an RItem by a uniform item of the whole catalogue E (N items). The draw can return the item
  itself, hence (Sec. 3.2.3)::

      Pr(SUB(s, t)) = p* + (1-p)(1-p*)/|G(s)| + p(1-p*)/N    if t = s
                    =      (1-p)(1-p*)/|G(s)| + p(1-p*)/N    if t in G(s) \\ {s}
                    =                           p(1-p*)/N    otherwise

* Eq. (12): ``eps = ln(1 + (p* + (1-p)(1-p*)/|G|) / (p(1-p*)/N))`` with ``|G| = min_s |G_lambda(s)|``: the largest
  ratio ``Pr(SUB(i,i)) / Pr(SUB(j,i))`` over ``i not in G(j)``. Eq. (13) is its p* = 0 case. Prop. 1's exact value
  ``ln max_{i != j, k} Pr(SUB(i,k)) / Pr(SUB(j,k))`` is also reported; Eq. (12) is never below it.
* Recommendation (Sec. 2.1.3-2.1.4): the K users whose AlterEgo is most cosine-similar to the active user's real like
  set; score = how many of them like the item (ties broken by summed similarity). i-D2P (Sec. 4.2.6): AlterReplica
  item profiles (sets of users, users substituted within user groups), item-item cosine on them, each item keeps its
  K nearest; score(u, i) = sum of the similarities of i to the items u likes.

Privacy, stated exactly: relation = one *event*, i.e. one liked item of one profile replaced by another (Def. 5).
Given the groups, Theorem 1 makes any use of the AlterEgo profiles (eps, lambda)-private with eps from Eq. (12). Not
covered: the groups come from the same training likes without noise (the paper suggests public item features), so
Eq. (12) is reported as ``epsilon_nominal`` (conditional on public groups) and ``epsilon`` is inf; the number of likes
per profile is revealed, so adding/removing a like or flipping like/dislike is not protected; the active user's own
real profile is used for their own recommendations. ``epsilon=inf`` keeps every item (p* = 1): the non-private
user-kNN (or item-kNN) on the original profiles.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings, RatingScale, dense_rows
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.predictors.base import BasePredictor
from dprec_torch.seeding import SecretGenerator, noise_generator

log = logging.getLogger(__name__)


# -------------------------------------------------------------------- groups
def like_threshold(scale: RatingScale, like_fraction: float) -> float:
    """A rating counts as a like when it is >= lo + like_fraction * span (4 on 1..5 for 0.75)."""
    return scale.lo + like_fraction * scale.span


def element_cosine(prof: torch.Tensor, elem: torch.Tensor, n_prof: int, n_elem: int) -> torch.Tensor:
    """Cosine between elements' binary vectors over profiles (dense ``n_elem x n_elem``, sparse Gram)."""
    x = torch.sparse_coo_tensor(torch.stack([prof, elem]), torch.ones(prof.numel(), device=prof.device), (n_prof, n_elem), check_invariants=False).coalesce()
    gram = torch.sparse.mm(x.t().coalesce(), x).to_dense()
    norm = gram.diagonal().sqrt()
    den = norm[:, None] * norm[None, :]
    return torch.where(den > 0, gram / den.clamp_min(1e-12), torch.zeros_like(gram)).clamp(max=1.0)


def form_groups(cos: torch.Tensor, lam: float, neighbor_groups: int | None = None) -> torch.Tensor:
    """Alg. 1 + Alg. 3 lines 6-9: ``G_lambda(i)`` as a bool ``[N, N]`` matrix (row i = its group items).
    ``GRP(i) = {i} + {j : cos(i,j) > 0 and 1/cos(i,j) - 1 < lambda}``, united with the groups that share an item with
    GRP(i) (all of them, or the top ``neighbor_groups`` by shared count, Def. 4)."""
    n = cos.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=cos.device)
    pos = cos > 0
    dist = torch.where(pos, 1.0 / cos.clamp_min(1e-12) - 1.0, torch.full_like(cos, float("inf")))
    grp = (pos & (dist < lam)) | eye
    g = grp.to(cos.dtype)
    shared = g @ g.t()  # shared[i, j] = |GRP(i) cap GRP(j)|
    if neighbor_groups is None:
        nbr = shared > 0
    else:
        s = shared.masked_fill(eye, 0.0)
        top = torch.topk(s, min(int(neighbor_groups), n - 1), dim=1) if n > 1 else None
        nbr = eye.clone()
        if top is not None:
            rows = torch.arange(n, device=cos.device)[:, None].expand_as(top.indices)
            nbr[rows[top.values > 0], top.indices[top.values > 0]] = True
    return ((nbr.to(cos.dtype) @ g) > 0) | grp


# --------------------------------------------------------- substitution and eps
def substitution_matrix(groups: torch.Tensor, p: float, p_star: float) -> torch.Tensor:
    """``Pr(SUB(s, t))`` for all s (rows), t (columns), Sec. 3.2.3 (float64)."""
    n = groups.shape[0]
    size = groups.sum(1, dtype=torch.float64)
    base = p * (1.0 - p_star) / n
    prob = torch.where(groups, (1.0 - p) * (1.0 - p_star) / size[:, None], torch.zeros((), dtype=torch.float64, device=groups.device)) + base
    return prob + p_star * torch.eye(n, dtype=torch.float64, device=groups.device)


def epsilon_eq12(p: float, p_star: float, n: int, g_min: int) -> float:
    """Eq. (12): ``ln(1 + (p* + (1-p)(1-p*)/|G|) / (p (1-p*) / N))``; inf when p = 0 or p* = 1."""
    if p_star >= 1.0 or p <= 0.0:
        return float("inf")
    return math.log1p((p_star + (1.0 - p) * (1.0 - p_star) / g_min) / (p * (1.0 - p_star) / n))


def epsilon_prop1(sub: torch.Tensor) -> float:
    """Prop. 1 exactly: ``ln max_{k} max_{i != j} Pr(SUB(i,k)) / Pr(SUB(j,k))`` from the full matrix."""
    if sub.shape[0] < 2:
        return 0.0
    hi = torch.topk(sub, 2, dim=0)  # two largest per column
    lo = torch.topk(sub, 2, dim=0, largest=False)  # two smallest per column
    best = hi.values[0] / lo.values[0]
    alt = torch.maximum(hi.values[0] / lo.values[1], hi.values[1] / lo.values[0])  # i == j: the runner-up on one side
    return float(torch.log(torch.where(hi.indices[0] == lo.indices[0], alt, best).max()))


def calibrate(epsilon: float, p: float, n: int, g_min: int) -> tuple[float, float]:
    """(p, p*) meeting Eq. (12) with equality: solve p* for the given p, or, when even p* = 0 is above ``epsilon``,
    raise p with p* = 0 (Eq. 13 solved for p)."""
    c = math.expm1(epsilon) * p / n
    q = (1.0 - p) / g_min
    if c >= q:
        return p, (c - q) / (1.0 + c - q)
    return n / (n + g_min * math.expm1(epsilon)), 0.0


# ------------------------------------------------------------------ AlterEgo
def alter_ego(prof: torch.Tensor, elem: torch.Tensor, groups: torch.Tensor, p: float, p_star: float, gen: SecretGenerator) -> torch.Tensor:
    """Selector (Alg. 2) + Profiler (Alg. 3) for every (profile, element) entry at once: new elements."""
    n = groups.shape[0]
    dev = elem.device
    u_sel = gen.rand(elem.shape, device=dev, dtype=torch.float64)
    u_keep = gen.rand(elem.shape, device=dev, dtype=torch.float64)
    u_pick = gen.rand(elem.shape, device=dev, dtype=torch.float64)
    in_r = u_sel < p  # Selector: RItems with probability p, else GItems
    keep = u_keep < p_star  # Profiler: retain with probability p*
    any_item = (u_pick * n).long().clamp_max(n - 1)
    rows, cols = groups.nonzero(as_tuple=True)  # CSR of G_lambda (row-major order)
    size = groups.sum(1)
    crow = torch.cumsum(size, 0) - size
    g_item = cols[crow[elem] + (u_pick * size[elem]).long().clamp_max(size[elem] - 1)]
    return torch.where(keep, elem, torch.where(in_r, any_item, g_item))


# ------------------------------------------------------------------ predictor
class D2P(BasePredictor):
    """D2P top-N recommender (user-based) and i-D2P (item-based) on AlterEgo/AlterReplica profiles.

    Args:
        epsilon: target eps of Eq. (12); ``inf`` = non-private (p* = 1). Finite values calibrate p*
            (or p, see :func:`calibrate`) unless ``p_star`` is given, in which case Eq. (12) must not exceed it.
        p: Selector probability. p_star: Profiler probability (``None`` = calibrate from epsilon).
        lam: distance threshold lambda. neighbor_groups: ``None`` (all sharing groups) or top-K (Def. 4).
        mode: ``"user"`` (D2P) or ``"item"`` (i-D2P). k: neighbours (users, or items per item).
        like_fraction: like threshold as a fraction of the rating span. seed: noise seed (None: secret, drawn from the OS entropy source).
    """

    name = "d2p"
    task = "topn"

    def __init__(self, epsilon: float = float("inf"), p: float = 0.5, p_star: float | None = None, lam: float = 1.0,
                 mode: str = "user", k: int = 50, neighbor_groups: int | None = None, like_fraction: float = 0.75,
                 seed: int | None = None, device: torch.device | str | None = None) -> None:
        super().__init__(device)
        self.epsilon = check_epsilon(epsilon, "d2p")
        if not 0.0 <= p <= 1.0 or (p_star is not None and not 0.0 <= p_star <= 1.0):
            raise ConfigError(f"d2p: p={p} and p_star={p_star} must lie in [0, 1]")
        if not lam >= 0:
            raise ConfigError(f"d2p: lam={lam} must be >= 0")
        if mode not in ("user", "item"):
            raise ConfigError(f"d2p: mode={mode!r} is unknown; use user (D2P) or item (i-D2P)")
        if int(k) != k or k < 1 or (neighbor_groups is not None and (int(neighbor_groups) != neighbor_groups or neighbor_groups < 0)):
            raise ConfigError(f"d2p: k={k} must be a positive integer and neighbor_groups={neighbor_groups} null or >= 0")
        if not 0.0 <= like_fraction <= 1.0:
            raise ConfigError(f"d2p: like_fraction={like_fraction} must lie in [0, 1]")
        self.p, self.p_star, self.lam, self.mode = float(p), None if p_star is None else float(p_star), float(lam), mode
        self.k, self.neighbor_groups = int(k), None if neighbor_groups is None else int(neighbor_groups)
        self.like_fraction, self.seed = float(like_fraction), None if seed is None else int(seed)  # None: secret noise (seeding.py)
        self.p_star_used_: float | None = None  # learned in fit: the Profiler's p* actually used

    # ---------------------------------------------------------------- fit
    def _resolve(self, n: int, g_min: int) -> tuple[float, float]:
        """(p, p*) actually used: explicit p* wins (checked against epsilon), else calibrated."""
        if self.p_star is not None:
            eps = epsilon_eq12(self.p, self.p_star, n, g_min)
            if math.isfinite(self.epsilon) and eps > self.epsilon * (1 + 1e-9):
                raise ConfigError(
                    f"d2p: p={self.p}, p_star={self.p_star}, lam={self.lam} give eps={eps:.3g} by Eq. (12), above epsilon={self.epsilon:g}; "
                    "drop model.p_star to calibrate it, or raise epsilon/p")
            return self.p, self.p_star
        if not math.isfinite(self.epsilon):
            return self.p, 1.0
        return calibrate(self.epsilon, self.p, n, g_min)

    def fit(self, train: Ratings) -> "D2P":
        """Grouping, Selector/Profiler (AlterEgo or AlterReplica profiles), and the kNN structures."""
        train = self._prepare(train, require_ratings=True)
        self.threshold_ = like_threshold(train.scale, self.like_fraction)
        liked = train.select(train.values >= self.threshold_)
        if len(liked) == 0:
            raise DataError(f"d2p: no training rating reaches the like threshold {self.threshold_:g}; lower model.like_fraction")
        if self.mode == "user":  # profiles = users, elements = items
            prof, elem, n_prof, n_elem = liked.users, liked.items, train.n_users, train.n_items
        else:  # i-D2P: profiles = items, elements = users
            prof, elem, n_prof, n_elem = liked.items, liked.users, train.n_items, train.n_users
        groups = form_groups(element_cosine(prof, elem, n_prof, n_elem), self.lam, self.neighbor_groups)
        sizes = groups.sum(1)
        self.g_min_ = int(sizes.min())
        self.p_used_, self.p_star_used_ = self._resolve(n_elem, self.g_min_)
        self.epsilon_eq12_ = epsilon_eq12(self.p_used_, self.p_star_used_, n_elem, self.g_min_)
        self.epsilon_prop1_ = epsilon_prop1(substitution_matrix(groups, self.p_used_, self.p_star_used_)) if self.p_star_used_ < 1 else float("inf")
        gen = noise_generator(self.seed, train.device, private=math.isfinite(self.epsilon))
        new_elem = alter_ego(prof, elem, groups, self.p_used_, self.p_star_used_, gen) if self.p_star_used_ < 1 else elem
        keys = torch.unique(prof * n_elem + new_elem)  # a substituted duplicate is one like
        alt_prof, alt_elem = keys // n_elem, keys % n_elem
        if self.mode == "user":
            self.alter_ = _binary(alt_prof, alt_elem, train.n_users, train.n_items)
            self.alter_norm_ = torch.bincount(alt_prof, minlength=train.n_users).to(torch.float32).sqrt()
        else:
            self.item_sim_ = _item_knn(alt_prof, alt_elem, train.n_items, train.n_users, self.k)
        self.n_elem_, self.group_mean_ = n_elem, float(sizes.double().mean())
        self._index_users(train, liked)
        log.info("d2p(%s): p=%.4g p*=%.4g lambda=%g |G|min=%d eps(Eq.12)=%.4g", self.mode, self.p_used_, self.p_star_used_,
                 self.lam, self.g_min_, self.epsilon_eq12_)
        return self

    def _index_users(self, train: Ratings, liked: Ratings) -> None:
        """Each active user's real like set and rated items (their own, used for their own recommendations)."""
        self.liked_, self.train_ = liked.indicator_csr(), train.indicator_csr()
        self.n_items_, self.n_users_ = train.n_items, train.n_users

    # ------------------------------------------------------------ release
    def released_state(self) -> dict[str, Any]:
        """The AlterEgo profiles (``mode=user``: (profile, liked item) pairs after substitution) or i-D2P's item kNN
        learned from the AlterReplica profiles, and the privacy report's figures. At p* = 1 (epsilon = inf) an
        AlterEgo is its user's own like set, which ``restore`` rebuilds from the ratings: it is not written."""
        if self.p_star_used_ is None:
            raise RuntimeError("D2P.released_state called before fit()")
        state: dict[str, Any] = {"n_items": int(self.n_items_), "p": self.p_used_, "p_star": self.p_star_used_,
                                 "g_min": self.g_min_, "epsilon_eq12": self.epsilon_eq12_, "epsilon_prop1": self.epsilon_prop1_,
                                 "n_elem": self.n_elem_, "group_mean": self.group_mean_}
        if self.mode == "user" and self.p_star_used_ < 1.0:
            state["alter_ego"] = self.alter_.indices()  # [2, likes]: (profile, item) of the released AlterEgos
        elif self.mode == "item":
            state["item_similarity"] = self.item_sim_
        return state

    def restore(self, train: Ratings, state: dict[str, Any]) -> "D2P":
        """The AlterEgo profiles (or i-D2P's item kNN) from ``state``; each active user's real likes from ``train``."""
        train = self._prepare(train, state)
        self.p_used_, self.p_star_used_, self.g_min_ = float(state["p"]), float(state["p_star"]), int(state["g_min"])
        self.epsilon_eq12_, self.epsilon_prop1_ = float(state["epsilon_eq12"]), float(state["epsilon_prop1"])
        self.n_elem_, self.group_mean_ = int(state["n_elem"]), float(state["group_mean"])
        self.threshold_ = like_threshold(train.scale, self.like_fraction)
        liked = train.select(train.values >= self.threshold_)
        if self.mode == "user":
            own = self.p_star_used_ >= 1.0  # no substitution: each AlterEgo is its user's own like set
            pairs = torch.stack([liked.users, liked.items]) if own else state["alter_ego"].to(train.device)
            self.alter_ = _binary(pairs[0], pairs[1], train.n_users, train.n_items)
            self.alter_norm_ = torch.bincount(pairs[0], minlength=train.n_users).to(torch.float32).sqrt()
        else:
            self.item_sim_ = state["item_similarity"].to(train.device)
        self._index_users(train, liked)
        return self

    # ---------------------------------------------------------- recommend
    def _scores(self, users: torch.Tensor, likes: torch.Tensor) -> torch.Tensor:
        """Item scores ``[B, M]`` for a batch of users with dense real like rows ``likes [B, M]``."""
        if self.mode == "item":
            return likes @ self.item_sim_.t()
        sim = torch.sparse.mm(self.alter_, likes.t()).t()  # [B, U] dot products with every AlterEgo
        norm = likes.sum(1).sqrt()
        sim = sim / (norm[:, None] * self.alter_norm_[None, :]).clamp_min(1e-12)
        sim[torch.arange(users.numel(), device=users.device), users] = float("-inf")  # not one's own AlterEgo
        top = torch.topk(sim, min(self.k, sim.shape[1] - 1), dim=1)
        w_count = torch.zeros_like(sim).scatter_(1, top.indices, (top.values > 0).to(sim.dtype))
        w_sim = torch.zeros_like(sim).scatter_(1, top.indices, top.values.clamp_min(0))
        count = torch.sparse.mm(self.alter_.t().coalesce(), w_count.t()).t()
        tie = torch.sparse.mm(self.alter_.t().coalesce(), w_sim.t()).t() / (self.k + 1)  # < 1: breaks ties only
        return torch.where(count > 0, count + tie, torch.zeros_like(count))

    def recommend(self, users: torch.Tensor, n: int, batch: int = 256) -> torch.Tensor:
        """Top-n items per user (Sec. 2.1.4), excluding training items; -1 where no item has any support."""
        if self.p_star_used_ is None:
            raise RuntimeError("D2P.recommend called before fit()")
        if int(n) != n or n < 1:
            raise ConfigError(f"recommend: n={n} must be a positive integer")
        users = torch.as_tensor(users, dtype=torch.long, device=self.device)
        if users.numel() and (int(users.min()) < 0 or int(users.max()) >= self.n_users_):
            raise DataError(f"d2p.recommend: user ids must lie in [0, {self.n_users_}); got [{int(users.min())}, {int(users.max())}]")
        n = min(int(n), self.n_items_)
        out = []
        for start in range(0, users.numel(), batch):  # batches of users, vectorised over all items
            u = users[start:start + batch]
            likes = dense_rows(self.liked_, u)
            rated = dense_rows(self.train_, u) > 0
            scores = self._scores(u, likes).double().masked_fill(rated, float("-inf"))
            scores = scores.masked_fill(scores <= 0, float("-inf"))  # no support: no recommendation
            top = torch.topk(scores, n, dim=1)
            out.append(torch.where(torch.isfinite(top.values), top.indices, torch.full_like(top.indices, -1)))
        return torch.cat(out) if out else torch.empty(0, n, dtype=torch.long, device=users.device)

    # ------------------------------------------------------------- privacy
    def privacy_report(self) -> dict[str, Any]:
        if self.p_star_used_ is None:
            return {"mechanism": "D2P (not fitted)", "relation": "event", "sensitivity": None, "noise": None,
                    "epsilon": float("inf"), "delta": 0.0, "analysis": "not fitted"}
        if self.p_star_used_ >= 1.0:
            return {"mechanism": "none (D2P at p*=1: original profiles, non-private kNN)", "relation": None, "sensitivity": None,
                    "noise": "none", "epsilon": float("inf"), "delta": 0.0, "analysis": "non-private", "p": self.p_used_, "p_star": 1.0}
        elems = "items" if self.mode == "user" else "users"
        return {
            "mechanism": f"D2P AlterEgo substitution ({self.mode}-based)",
            "relation": f"event: one liked element of one profile replaced by another (Def. 5), elements = {elems}",
            "sensitivity": "n/a (randomised substitution; bounded substitution-probability ratio, Prop. 1)",
            "noise": (f"Selector p={self.p_used_:.4g}, Profiler p*={self.p_star_used_:.4g}, lambda={self.lam:g}, "
                      f"N={self.n_elem_}, min|G_lambda|={self.g_min_}, mean|G_lambda|={self.group_mean_:.1f}"),
            "epsilon": float("inf"), "epsilon_nominal": self.epsilon_eq12_,
            "epsilon_nominal_scope": ("Eq. (12), per substituted liked element (Def. 5), CONDITIONAL on the lambda-groups "
                                      "being public; here they are built from the private likes without noise"),
            "epsilon_prop1": self.epsilon_prop1_,
            "delta": 0.0, "p": self.p_used_, "p_star": self.p_star_used_, "lambda": self.lam,
            "analysis": (
                "Eq. (12) bounds Prop. 1's substitution ratio; Theorem 1 (Lemma 2 + Corollary 1) makes every use of the "
                "AlterEgo profiles (eps, lambda)-private for one substituted liked element GIVEN the groups. The groups are "
                "computed from the same training likes without noise, so the bound is conditional on treating them as public "
                "(epsilon_nominal) and no end-to-end epsilon is claimed (epsilon = inf). Also: profile sizes are revealed "
                "(adding/removing a like is not covered); the active user's own profile is used for their own recommendations."
            ),
        }


def _binary(rows: torch.Tensor, cols: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(rows.numel(), device=rows.device), (n_rows, n_cols), check_invariants=False).coalesce()


def _item_knn(items: torch.Tensor, users: torch.Tensor, n_items: int, n_users: int, k: int) -> torch.Tensor:
    """i-D2P: cosine between AlterReplica item profiles, each row keeping its k largest (self excluded)."""
    cos = element_cosine(users, items, n_users, n_items)  # items are the compared elements here
    cos.fill_diagonal_(0.0)
    top = torch.topk(cos, min(k, n_items - 1), dim=1)
    return torch.zeros_like(cos).scatter_(1, top.indices, top.values.clamp_min(0))

