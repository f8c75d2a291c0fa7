"""``mechanism.select=private``: Liu & Talwar's random-stopping selection counted in epsilon (the score's sensitivity on
neighbouring datasets, the refusals, and a whole run whose report and release carry the selection)."""

from __future__ import annotations

import json

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.training.private_selection import ROUND_SHARE, clipped_error_sum
from dprec_torch.training.run import train, validate
from tests.helpers import tiny_cfg

BASE = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false", "mechanism=dpsgd"]
SELECT = ["mechanism.select=private", "mechanism.select_rounds=2"]


@pytest.mark.parametrize("seed", range(20))
def test_the_score_moves_by_at_most_B_when_one_user_leaves(seed):
    """The clipped validation score has L1 sensitivity B under add/remove one user, adversarial users included
    (a user whose every prediction is off by the whole span, a user with one rating, a user with many)."""
    g = torch.Generator().manual_seed(seed)
    n_users, bound = 30, 16.0
    users = torch.randint(0, n_users, (400,), generator=g)
    truth = torch.randint(1, 6, (400,), generator=g).double()
    pred = truth + (torch.rand(400, generator=g, dtype=torch.float64) - 0.5) * 8 * (seed % 3)
    pred[users == 0] = 5.0 + 4.0 * (truth[users == 0] == 1).double()  # user 0: off by the whole span (and more)
    full = clipped_error_sum(pred, truth, users, n_users, bound)
    for leaver in range(n_users):
        keep = users != leaver
        without = clipped_error_sum(pred[keep], truth[keep], users[keep], n_users, bound)
        assert 0.0 <= full - without <= bound + 1e-9


@pytest.mark.parametrize("overrides, message", [
    (["mechanism=gaussian", "+mechanism.select=private"], "pure-epsilon"),
    (["mechanism=dpsgd", "mechanism.select=private", "epsilon=inf"], "finite epsilon"),
    (["mechanism=dpsgd", "mechanism.select=sometimes"], "mechanism.select=sometimes"),
    (["mechanism=dpsgd", "mechanism.select=private", "mechanism.select_grid={lerning_rate: [1]}"], "lerning_rate"),
    (["mechanism=dpsgd", "mechanism.select=private", "mechanism.select_rounds=0.5"], "select_rounds"),
    (["mechanism=dpsgd", "mechanism.select=private", "resume=true"], "resume"),
    (["mechanism=dpsgd", "mechanism.select=private", "mechanism.select_grid={clip_norm: [auto, -1]}"], "select_grid.clip_norm holds -1"),
])
def test_a_selection_the_proof_does_not_cover_is_refused_before_any_data_is_read(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny_cfg("data=synthetic", "device=cpu", *overrides))


def test_a_private_selection_run_defends_the_typed_epsilon_and_releases_the_chosen_round(tmp_path):
    out = tmp_path / "run"
    metrics = train(tiny_cfg(*BASE, *SELECT, "epsilon=3", "noise_seed=5", f"output_dir={out}"))
    privacy = metrics["privacy"]
    sel = privacy["selection"]
    assert privacy["epsilon"] == 3.0 and privacy["delta"] == 0.0
    assert sel["epsilon_per_round"] == pytest.approx(3.0 / ROUND_SHARE)
    assert sel["epsilon_train_per_round"] + sel["epsilon_score_per_round"] == pytest.approx(3.0 / ROUND_SHARE)
    assert privacy["epsilon_before_selection"] == pytest.approx(sel["epsilon_train_per_round"])
    assert sel["rounds"] == len(sel["noisy_scores"]) == len(sel["candidates"]) >= 1
    best = max(range(sel["rounds"]), key=lambda j: sel["noisy_scores"][j])
    assert sel["chosen"] == sel["candidates"][best]
    grid = sel["grid"]
    assert all(sel["chosen"][k] in grid[k] for k in grid)
    assert "Liu & Talwar" in privacy["analysis"] and 0 < metrics["test_rmse"] < 2
    release = torch.load(out / "release_fold1.pt", weights_only=True)
    assert release["meta"]["privacy"]["epsilon"] == 3.0 and release["meta"]["privacy"]["selection"]["chosen"] == sel["chosen"]
    # the same job under the same noise seed selects the same way (the selection's draws are keyed too)
    again = train(tiny_cfg(*BASE, *SELECT, "epsilon=3", "noise_seed=5", f"output_dir={tmp_path / 'again'}"))
    assert again["privacy"]["selection"]["noisy_scores"] == sel["noisy_scores"]
    assert json.loads((out / "metrics.json").read_text())["privacy"]["selection"]["chosen"] == sel["chosen"]


def test_one_expected_round_stops_after_the_first(tmp_path):
    """gamma = 1 / select_rounds = 1: the geometric number of rounds is exactly 1."""
    metrics = train(tiny_cfg(*BASE, "mechanism.select=private", "mechanism.select_rounds=1", "epsilon=3",
                             f"output_dir={tmp_path}"))
    assert metrics["privacy"]["selection"]["rounds"] == 1


def test_the_selection_draws_from_the_secret_key_when_no_noise_seed_is_given(tmp_path):
    """Without ``noise_seed`` each run's selection (candidates, score noise, stopping) comes from its own secret
    256-bit key: two runs of the same job draw different noisy scores."""
    scores = [train(tiny_cfg(*BASE, "mechanism.select=private", "mechanism.select_rounds=1", "epsilon=3",
                             f"output_dir={tmp_path / str(k)}"))["privacy"]["selection"]["noisy_scores"] for k in range(2)]
    assert scores[0] != scores[1]
