"""Shared predictor contract (LensKit/Surprise style): every predictor test class inherits it.

A subclass defines ``make_predictor(self)`` returning an unfitted predictor.
"""

from __future__ import annotations

import torch

from tests.helpers import tiny_fold


class PredictorContract:
    #: absolute tolerance of the fallback checks (noisy mechanisms raise it)
    tolerance = 1e-5

    def make_predictor(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def expected_unknown_user(self, train, item: int) -> float:
        """The documented fallback for an unknown user: the item mean (default)."""
        return float(train.scale.clip(train.item_means()[item]))

    def expected_unknown_item(self, train, user: int) -> float:
        """The documented fallback for an unknown item: the global mean (default)."""
        return train.global_mean

    def fitted(self, seed: int = 0):
        torch.manual_seed(seed)
        fold = tiny_fold()
        return self.make_predictor().fit(fold.train), fold

    def test_unknown_user_gets_item_mean(self):
        pred, fold = self.fitted()
        train = fold.train
        item = int(train.items[0])
        out = pred.predict(torch.tensor([train.n_users + 5, -1]), torch.tensor([item, item]))
        expected = self.expected_unknown_user(train, item)
        assert torch.allclose(out.float(), torch.full((2,), float(expected)), atol=self.tolerance)

    def test_unknown_item_gets_global_mean(self):
        pred, fold = self.fitted()
        train = fold.train
        user = int(train.users[0])
        out = pred.predict(torch.tensor([user]), torch.tensor([train.n_items + 3]))
        assert abs(float(out[0]) - self.expected_unknown_item(train, user)) < self.tolerance

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
