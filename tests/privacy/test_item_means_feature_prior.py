"""The item means' feature prior (``mean_feature_prior``): post-processing of the released (S~, C~) and public features."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.privacy.item_means import ItemMeansSpec, feature_prior_mean, release_item_means
from dprec_torch.seeding import noise_generator
from tests.helpers import tiny_cfg, tiny_fold

LAPLACE = dict(estimator="posterior", relation="user", noise="laplace", prior_std=0.5, count_weight=0.3)


def _train():
    return tiny_fold(2).train


def _features(m: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.rand(m, 3, generator=g) < 0.3).double()


def test_off_or_without_features_the_release_is_the_constant_prior_bit_for_bit():
    train = _train()
    feats = _features(train.n_items)
    plain = release_item_means(train, ItemMeansSpec(**LAPLACE), noise_generator(1), epsilon=2.0).means
    same = release_item_means(train, ItemMeansSpec(**LAPLACE), noise_generator(1), epsilon=2.0, features=feats).means
    none = release_item_means(train, ItemMeansSpec(**LAPLACE, feature_prior=True), noise_generator(1), epsilon=2.0).means
    assert torch.equal(plain, same) and torch.equal(plain, none)


def test_the_prior_reads_only_the_released_statistics_and_public_features():
    """Same noise key, same data: the feature-prior means differ from the constant-prior ones only through the
    post-processing (both releases draw the same noise and report the same sensitivity and epsilon)."""
    train = _train()
    feats = _features(train.n_items)
    a = release_item_means(train, ItemMeansSpec(**LAPLACE), noise_generator(3), epsilon=1.0)
    b = release_item_means(train, ItemMeansSpec(**LAPLACE, feature_prior=True), noise_generator(3), epsilon=1.0, features=feats)
    assert torch.equal(a.counts, b.counts) and a.global_mean == b.global_mean
    assert (a.epsilon, a.sensitivity, a.noise_std) == (b.epsilon, b.sensitivity, b.noise_std)
    assert not torch.equal(a.means, b.means) and "feature_prior" in b.details


def test_the_prior_is_the_precision_weighted_feature_fit_and_vanishes_without_noise():
    """feature_prior_mean recovers deviations that ARE a function of the features (x_i . beta); and as the noise
    goes to 0 the posterior tends to S'_i / C_i whatever the prior."""
    g = torch.Generator().manual_seed(1)
    feats = _features(60)
    x = torch.cat([torch.ones(60, 1, dtype=torch.float64), feats], 1)
    beta = torch.tensor([0.1, -0.3, 0.2, 0.05], dtype=torch.float64)
    cp = 50 + 100 * torch.rand(60, generator=g, dtype=torch.float64)
    prior = feature_prior_mean(cp, cp * (x @ beta), 1.0, 0.0625, feats)
    assert torch.allclose(prior, x @ beta, atol=0.01)  # the ridge (1) against weights ~ 1 / tau^2 = 16 an item
    train = _train()
    a = release_item_means(train, ItemMeansSpec(**LAPLACE), noise_generator(5), epsilon=1e6)
    b = release_item_means(train, ItemMeansSpec(**LAPLACE, feature_prior=True), noise_generator(5), epsilon=1e6,
                           features=_features(train.n_items))
    assert torch.allclose(a.means, b.means, atol=1e-3)


def test_dpsgd_refuses_the_feature_prior_on_the_full_pnbm(tmp_path):
    from dprec_torch.training.run import train

    with pytest.raises(ConfigError, match="mean_feature_prior"):
        train(tiny_cfg("data=synthetic", "device=cpu", "model=pnbm", "mechanism=dpsgd", "epsilon=2", "tensorboard=false",
                       "+mechanism.mean_feature_prior=true", f"output_dir={tmp_path}", "compare_baselines=false"))
