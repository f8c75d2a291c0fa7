"""Top-k sparse similarity (model=pnbm_topk): equals dense PNBM with S zero off the support; O(M k) state."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.models.batching import PoissonBatchSampler, UserBatch, full_batch
from dprec_torch.models.pnbm import PNBM
from dprec_torch.models.pnbm_topk import PNBMTopK, corating_support, mirror_index, pcc_support, random_support
from dprec_torch.seeding import noise_generator
from dprec_torch.training.run import train
from tests.contract import PredictorContract
from tests.helpers import tiny_cfg, tiny_fold, toy_ratings


def random_ratings(n_users: int = 50, n_items: int = 30, density: float = 0.35, seed: int = 0) -> Ratings:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n_users, n_items, generator=g) < density
    mask[2] = False
    u, i = mask.nonzero(as_tuple=True)
    return Ratings(u, i, torch.randint(1, 6, (u.numel(),), generator=g).float(), n_users, n_items, RatingScale(1, 5))


def dense_twin(m: PNBMTopK, train: Ratings, gradient: str) -> PNBM:
    """A dense PNBM whose S is the top-k model's values on the support and 0 elsewhere."""
    d = PNBM(train.n_items, floor_c=m.floor_c, n_neighbors=m.n_neighbors, gradient=gradient,
             formulation="dense").attach(train).double()
    S = torch.zeros(train.n_items, train.n_items, dtype=torch.float64)
    S.scatter_(1, m.neighbors, m.S_values.detach().double())
    with torch.no_grad():
        d.S.copy_(S)
    return d


def as_double(b: UserBatch) -> UserBatch:
    return UserBatch(b.users, b.x.double(), b.ind.double(), b.rows, b.items, b.values.double(), b.target_index)


@pytest.mark.parametrize("gradient", ["exact", "paper_eq5"])
@pytest.mark.parametrize("k,floor_c", [(5, 0.5), (12, 3.0), (29, 1.0)])  # k = M - 1: the full support
@pytest.mark.parametrize("rows_per_block", [4, 1000])  # several dense row blocks / one
def test_matches_dense_pnbm_restricted_to_the_support(gradient, k, floor_c, rows_per_block):
    train = random_ratings()
    m = PNBMTopK(train.n_items, sparse_k=k, floor_c=floor_c, gradient=gradient, init_scale=1.0, seed=3,
                 block_budget=rows_per_block * (train.n_items + 1), pair_budget=64).attach(train).double()
    with torch.no_grad():
        m.S_values.add_(torch.randn(m.S_values.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    d = dense_twin(m, train, gradient)
    sampler = PoissonBatchSampler(train, m.item_means.float(), 0.5, "rating", noise_generator(2))
    for batch in (full_batch(train, m.item_means.float()), sampler.sample()):
        batch = as_double(batch)
        grads, preds = [], []
        for model in (m, d):
            model.zero_grad()
            pred = model.batch_predict(batch)
            model.surrogate_loss(batch, (pred - batch.values).detach().clamp(-2, 2)).backward()
            preds.append(pred.detach())
            grads.append(model.S_values.grad if model is m else model.S.grad)
        assert torch.allclose(preds[0], preds[1], rtol=1e-10, atol=1e-10)
        on_support = grads[1].gather(1, m.neighbors)
        assert torch.allclose(grads[0], on_support, rtol=1e-10, atol=1e-10)
        assert float(grads[0].abs().max()) > 0


@pytest.mark.parametrize("n_neighbors", [3, 12, 28, 100])  # <= #positives, into the zeros, into the negatives, all
def test_predict_matches_dense_twin_with_top_neighbours(n_neighbors):
    """Prediction = dense PNBM's (top-N_k by value per row) on S extended by zeros off the support."""
    train = random_ratings(seed=1)
    m = PNBMTopK(train.n_items, sparse_k=10, n_neighbors=n_neighbors, floor_c=0.5, init_scale=1.0, seed=1,
                 block_budget=7 * (train.n_items + 1)).attach(train)
    with torch.no_grad():
        m.S_values.copy_(torch.randn(m.S_values.shape, generator=torch.Generator().manual_seed(5)))
    d = dense_twin(m, train, "exact").float()
    users = torch.arange(train.n_users).repeat_interleave(train.n_items)
    items = torch.arange(train.n_items).repeat(train.n_users)
    assert torch.allclose(m.predict(users, items), d.predict(users, items), atol=1e-5)


def test_corating_support_is_the_most_co_rated_items():
    #      i0 i1 i2 i3
    r = toy_ratings([[5, 3, None, 1], [4, None, 2, 1], [1, 1, None, 5], [None, 1, 5, 4]])
    nb = corating_support(r, 2)
    # co-raters: n01 = 2, n02 = 1, n03 = 3 -> item 0 keeps {1, 3}; n31 = 3, n30 = 3, n32 = 2 -> item 3 keeps {0, 1}
    assert nb[0].tolist() == [1, 3] and nb[3].tolist() == [0, 1]
    assert not (nb == torch.arange(4)[:, None]).any()  # never its own neighbour


def test_random_support_is_data_independent_and_seeded():
    a, b = random_support(40, 7, 3, torch.device("cpu")), random_support(40, 7, 3, torch.device("cpu"))
    assert torch.equal(a, b) and not torch.equal(a, random_support(40, 7, 4, torch.device("cpu")))
    assert not (a == torch.arange(40)[:, None]).any()
    assert all(row.unique().numel() == 7 for row in a)


def test_symmetry_on_mirrored_support_entries():
    train = random_ratings(seed=2)
    m = PNBMTopK(train.n_items, sparse_k=8, init_scale=1.0).attach(train)
    with torch.no_grad():
        m.S_values.add_(torch.randn(m.S_values.shape))
    before = m.S_values.detach().clone().view(-1)
    m.project_()
    mir = mirror_index(m.neighbors)
    v = m.S_values.detach().view(-1)
    has = mir >= 0
    assert int(has.sum()) > 0 and int((~has).sum()) > 0
    assert torch.equal(v[has], v[mir[has]])
    assert torch.allclose(v[has], (before[has] + before[mir[has]]) / 2)
    assert torch.equal(v[~has], before[~has])  # no mirror: unchanged


@pytest.mark.parametrize("support", ["pcc", "corating"])
def test_state_is_o_m_k_and_data_dependent_support_is_flagged(support):
    train = random_ratings(n_items=30)
    m = PNBMTopK(train.n_items, sparse_k=4, support=support).attach(train)
    assert m.S_values.shape == (30, 4) and m.neighbors.shape == (30, 4)
    assert m.memory_bytes() == 30 * 4 * (4 + 8 + 8)
    assert "NON-PRIVATE" in m.privacy_caveat and support in m.privacy_caveat
    assert PNBMTopK(train.n_items, sparse_k=4, support="random").attach(train).privacy_caveat is None


def test_pcc_support_matches_the_shrunk_pearson_similarity():
    from dprec_torch.predictors import similarity

    train = random_ratings(n_users=80, n_items=25, seed=6)
    score = similarity.pearson(train, shrinkage=10.0).double()
    score.fill_diagonal_(float("-inf"))
    expected = torch.sort(torch.topk(score, 6, dim=1).indices, dim=1).values
    got = pcc_support(train, 6, shrinkage=10.0, block_cells=7 * 26)  # 7 rows per block
    # equal up to exact ties in the score
    same = (got == expected).all(1)
    tied = torch.stack([torch.isclose(score[i, got[i]].sort().values, score[i, expected[i]].sort().values).all()
                        for i in range(25)])
    assert bool((same | tied).all()) and int(same.sum()) > 20


def test_bad_config_values():
    with pytest.raises(ConfigError, match="sparse_k"):
        PNBMTopK(10, sparse_k=10)
    with pytest.raises(ConfigError, match="support"):
        PNBMTopK(10, sparse_k=3, support="knn")


def test_training_reduces_error():
    fold = tiny_fold()
    m = PNBMTopK(fold.train.n_items, sparse_k=40, floor_c=1.0).attach(fold.train)
    opt = MapSGD(m.parameters(), TrainingContext(5, 1, len(fold.train), fold.train.n_users, fold.train.scale), lr=0.4)
    b = full_batch(fold.train, m.item_means)
    errs = []
    for _ in range(5):
        opt.zero_grad()
        pred = m.batch_predict(b)
        errs.append(float(((pred.detach() - b.values) ** 2).mean()))
        m.surrogate_loss(b, (pred - b.values).detach()).backward()
        opt.step()
        m.project_()
    assert errs[-1] < errs[0]


def test_hydra_config_trains_one_epoch(tmp_path):
    cfg = tiny_cfg("model=pnbm_topk", "model.sparse_k=30", "data=synthetic", "device=cpu", "compare_baselines=false",
                   "tensorboard=false", "mechanism=dpsgd_paper", "epsilon=5", "mechanism.epochs=1",
                   f"output_dir={tmp_path}")
    out = train(cfg)
    assert 0 < out["test_rmse"] < 2.5


class _FittedTopK:
    def fit(self, train):
        m = PNBMTopK(train.n_items, sparse_k=30, floor_c=1.0, seed=0).attach(train)
        opt = MapSGD(m.parameters(), TrainingContext(3, 1, len(train), train.n_users, train.scale), lr=0.4, beta=10.0)
        b = full_batch(train, m.item_means)
        for _ in range(3):
            opt.zero_grad()
            pred = m.batch_predict(b)
            m.surrogate_loss(b, pred - b.values).backward()
            opt.step()
            m.project_()
        self.model = m
        return self

    def predict(self, users, items):
        return self.model.predict(users, items)


class TestPNBMTopKContract(PredictorContract):
    def make_predictor(self):
        return _FittedTopK()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_topk_on_cuda_matches_cpu():
    train = random_ratings(seed=9)
    grads, preds = [], []
    for dev in ("cpu", "cuda"):
        m = PNBMTopK(train.n_items, sparse_k=8, floor_c=0.5, init_scale=1.0, seed=0).to(dev).attach(train.to(dev))
        b = full_batch(train.to(dev), m.item_means)
        pred = m.batch_predict(b)
        m.surrogate_loss(b, (pred - b.values).detach()).backward()
        grads.append(m.S_values.grad.cpu())
        preds.append(m.predict(train.users.to(dev), train.items.to(dev)).cpu())
    assert torch.allclose(grads[0], grads[1], atol=1e-4, rtol=1e-4)
    assert torch.allclose(preds[0], preds[1], atol=1e-4)
