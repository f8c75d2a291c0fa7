"""Shared predictor contract (LensKit/Surprise style): every predictor test class inherits it.

A subclass defines ``make_predictor(self)`` returning an unfitted predictor.
"""

from __future__ import annotations

import torch

from tests.helpers import tiny_fold


class PredictorContract:
    def make_predictor(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def fitted(self, seed: int = 0):
        torch.manual_seed(seed)
        fold = tiny_fold()
        return self.make_predictor().fit(fold.train), fold

    def test_unknown_user_gets_item_mean(self):
        pred, fold = self.fitted()
        train = fold.train
        item = int(train.items[0])
        out = pred.predict(torch.tensor([train.n_users + 5, -1]), torch.tensor([item, item]))
        expected = float(train.scale.clip(train.item_means()[item]))
        assert torch.allclose(out.float(), torch.full((2,), expected), atol=1e-5)

    def test_unknown_item_gets_global_mean(self):
        pred, fold = self.fitted()
        train = fold.train
        user = int(train.users[0])
        out = pred.predict(torch.tensor([user]), torch.tensor([train.n_items + 3]))
        assert abs(float(out[0]) - train.global_mean) < 1e-5

    def test_predictions_within_scale(self):
        pred, fold = self.fitted()
        out = pred.predict(fold.test.users, fold.test.items)
        assert torch.isfinite(out).all()
        assert float(out.min()) >= fold.train.scale.lo - 1e-6 and float(out.max()) <= fold.train.scale.hi + 1e-6

    def test_deterministic_under_seed(self):
        a, fold = self.fitted(seed=3)
        b, _ = self.fitted(seed=3)
        assert torch.equal(a.predict(fold.test.users, fold.test.items), b.predict(fold.test.users, fold.test.items))

    def test_beats_global_mean_on_tiny(self):
        pred, fold = self.fitted()
        out = pred.predict(fold.test.users, fold.test.items)
        rmse = torch.sqrt(((out - fold.test.values) ** 2).mean())
        base = torch.sqrt(((fold.train.global_mean - fold.test.values) ** 2).mean())
        assert rmse < base
