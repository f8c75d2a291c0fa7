"""PNBM (Wang & Tang Eq. (2)): hand-computed forward pass, exact gradient vs finite differences, contract."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.models.batching import full_batch
from dprec_torch.models.pnbm import PNBM
from tests.contract import PredictorContract
from tests.helpers import toy_ratings

TOY = [
    [5, 3, None],  # u0
    [4, None, 2],  # u1
    [1, 1, 4],  # u2
]


def toy_model(floor_c: float = 0.01, gradient: str = "exact") -> tuple[PNBM, object]:
    r = toy_ratings(TOY)
    m = PNBM(3, floor_c=floor_c, n_neighbors=3, gradient=gradient).attach(r)
    with torch.no_grad():
        m.S.copy_(torch.tensor([[0.0, 0.5, -0.2], [0.5, 0.0, 0.8], [-0.2, 0.8, 0.0]]))
    return m, r


def test_forward_by_hand():
    m, r = toy_model()
    # item means: i0 = 10/3, i1 = 2, i2 = 3.  u2 predicting i0 uses j=1 (x=1-2=-1) and j=2 (x=4-3=1):
    # r_hat = 10/3 + (0.5*(-1) + (-0.2)*1) / (|0.5| + |-0.2|) = 10/3 - 1
    expected = 10 / 3 + (0.5 * -1 + -0.2 * 1) / 0.7
    assert float(m.predict(torch.tensor([2]), torch.tensor([0]))[0]) == pytest.approx(expected, abs=1e-5)
    b = full_batch(r, m.item_means)
    pred = m.batch_predict(b)
    k = int(((b.rows == int((b.users == 2).nonzero())) & (b.items == 0)).nonzero())
    assert float(pred[k].detach()) == pytest.approx(expected, abs=1e-5)


def test_denominator_floor():
    m, _ = toy_model(floor_c=2.0)
    # same terms, but |S_0| I_u = 0.7 < C = 2, so the denominator is C
    expected = 10 / 3 + (0.5 * -1 + -0.2 * 1) / 2.0
    assert float(m.predict(torch.tensor([2]), torch.tensor([0]))[0]) == pytest.approx(expected, abs=1e-5)


def test_top_n_neighbours_at_prediction():
    m, _ = toy_model()
    m.n_neighbors = 1  # each row keeps its largest s: row 0 keeps s_01 = 0.5 only
    expected = 10 / 3 + (0.5 * -1) / 0.5
    assert float(m.predict(torch.tensor([2]), torch.tensor([0]))[0]) == pytest.approx(expected, abs=1e-5)


def _loss(m: PNBM, b, S: torch.Tensor) -> torch.Tensor:
    num, den = m.batch_terms(b, S)
    return 0.5 * ((m.item_means[b.items].double() + num / den - b.values.double()) ** 2).sum()


@pytest.mark.parametrize("floor_c", [0.01, 0.6])
def test_exact_gradient_matches_finite_differences(floor_c):
    torch.manual_seed(0)
    r = toy_ratings([[5, 3, None, 2], [4, None, 2, 5], [1, 1, 4, None], [2, 5, 5, 1]])
    m = PNBM(4, floor_c=floor_c).attach(r).double()
    with torch.no_grad():
        m.S.copy_(torch.randn(4, 4, dtype=torch.float64) * 0.5)
    b = full_batch(r, m.item_means)
    b.x, b.ind = b.x.to(torch.float64), b.ind.to(torch.float64)
    pred = m.batch_predict(b)
    m.surrogate_loss(b, (pred - b.values.double()).detach()).backward()
    grad = m.S.grad.clone()
    h = 1e-6
    for i in range(4):
        for j in range(4):
            if i == j:
                continue
            Sp, Sm = m.S.detach().clone(), m.S.detach().clone()
            Sp[i, j] += h
            Sm[i, j] -= h
            fd = (_loss(m, b, Sp) - _loss(m, b, Sm)) / (2 * h)
            assert float(grad[i, j]) == pytest.approx(float(fd), rel=1e-5, abs=1e-7)


def test_paper_eq5_gradient_formula():
    """Eq. (5): G_ij(u) = e_ui (x_uj - r_hat_ui I_uj) / (S_i I_u^-), sign of s_ij dropped."""
    m, r = toy_model(gradient="paper_eq5")
    b = full_batch(r, m.item_means)
    e = torch.ones(b.n_targets)
    m.surrogate_loss(b, e).backward()
    # With e = 1, G_0j = sum over raters u of i0 of (x_uj - r_hat_c_ui I_uj) / (|S_0| I_u^-):
    # (u1, i0): history i2 (x = 2 - 3 = -1), den = 0.2, r_hat_c = (-0.2 * -1) / 0.2 = 1  -> j=2: (-1 - 1)/0.2 = -10
    # (u2, i0): x = (., -1, 1), den = 0.7, r_hat_c = (0.5*-1 - 0.2*1)/0.7 = -1           -> j=2: (1 + 1)/0.7
    # (u0, i0): history i1 (x = 1), den = 0.5, r_hat_c = 1                                -> j=1: (1 - 1)/0.5 = 0
    # The exact gradient would flip the sign of the denominator term for s_02 < 0; Eq. (5) does not.
    assert float(m.S.grad[0, 2]) == pytest.approx(-10 + 2 / 0.7, abs=1e-4)
    assert float(m.S.grad[0, 1]) == pytest.approx(0.0, abs=1e-5)


def test_symmetry_and_zero_diagonal_kept():
    m = PNBM(5, seed=1)
    assert torch.allclose(m.S.detach(), m.S.detach().T) and float(m.S.detach().diagonal().abs().max()) == 0.0
    with torch.no_grad():
        m.S.add_(torch.randn(5, 5))
    m.project_()
    assert torch.allclose(m.S.detach(), m.S.detach().T) and float(m.S.detach().diagonal().abs().max()) == 0.0


class _FittedPNBM:
    """PNBM behind the fit/predict interface: a few non-private full-batch steps."""

    def __init__(self) -> None:
        self.model = None

    def fit(self, train):
        from dprec_torch.mechanisms.context import TrainingContext
        from dprec_torch.mechanisms.sgd import MapSGD

        m = PNBM(train.n_items, floor_c=1.0, seed=0).attach(train)
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


class TestPNBMContract(PredictorContract):
    def make_predictor(self):
        return _FittedPNBM()
