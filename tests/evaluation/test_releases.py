"""Every fitted model writes its release and ``load_run`` restores it without refitting.

Each model on the ``fit_fold`` path is trained on ``data=synthetic`` (tiny); a FRESH PROCESS then loads the run and
must give the same test RMSE (to 1e-6) and the same top-N for a user as the run itself. The release file holds
tensors and numbers only: never the noise seed, a generator's state or the training ratings. Models that draw
fresh noise per answer (PNCF, ``laplace_output``, ``exponential_topk``) are checked with an explicit
``noise_seed``: a restored curator then repeats the answers of the fitted run, query for query.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dprec_torch
from dprec_torch.errors import ConfigError
from dprec_torch.predictors.release import ReleasesState, check_no_secrets, read_release, release_path
from tests.helpers import walk as _walk

ROOT = Path(__file__).resolve().parents[2]
BASE = ["data=synthetic", "device=cpu", "tensorboard=false", "compare_baselines=false"]
SEED = 424242  # the explicit noise seed of the seeded cases: it must appear nowhere in a release file

CASES: dict[str, list[str]] = {
    "noisy_gram": ["model=noisy_gram", "epsilon=1"],
    "noisy_gram_lowrank_features": ["model=noisy_gram", "epsilon=1", "model.relation=user", "model.estimator=lowrank",
                                    "model.item_features=auto"],
    "noisy_gram_pnbm": ["model=noisy_gram", "epsilon=1", "model.estimator=pnbm", "model.k=20"],
    "dpals": ["model=dpals", "epsilon=1"],
    "mcsherry": ["model=mcsherry", "epsilon=1"],
    "pncf": ["model=pncf", "epsilon=1", f"noise_seed={SEED}"],
    "d2p": ["model=d2p", "epsilon=1"],
    "slope_one": ["model=slope_one", "epsilon=inf"],
    "slope_one_laplace_output": ["model=slope_one", "mechanism=laplace_output", "epsilon=1", f"noise_seed={SEED}"],
    "slope_one_exponential_topk": ["model=slope_one", "mechanism=exponential_topk", "epsilon=1", f"noise_seed={SEED}"],
    "cosine_implicit": ["model=cosine_implicit", "epsilon=inf"],
    "pcc": ["model=pcc", "model.k=20", "epsilon=inf"],
    "cos": ["model=cos", "model.k=20", "epsilon=inf"],
}
#: the models whose own finite epsilon covers the release file
COVERED = {"noisy_gram", "noisy_gram_lowrank_features", "noisy_gram_pnbm", "dpals", "mcsherry"}

FRESH = """
import json, sys
import dprec_torch
out = {}
for name, run_dir, user in json.loads(sys.argv[1]):
    run = dprec_torch.load_run(run_dir)
    out[name] = {"evaluate": run.evaluate(), "top": run.recommend(user, 5)}
open(sys.argv[2], "w").write(json.dumps(out))
"""


def _user(run) -> object:
    """The raw id of the first training user of fold 1 (a user with ratings)."""
    return run.dataset.user_ids[int(run.folds[1].train.users[0])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case trained once; each run queried here (evaluate, then recommend) and in one fresh process."""
    root = tmp_path_factory.mktemp("releases")
    here, todo = {}, []
    for name, overrides in CASES.items():
        run = dprec_torch.train([*BASE, *overrides, f"output_dir={root / name}"])
        user = _user(run)
        here[name] = {"run": run, "evaluate": run.evaluate(), "top": run.recommend(user, 5)}
        todo.append((name, str(root / name), user))
    result = root / "fresh.json"
    proc = subprocess.run([sys.executable, "-c", FRESH, json.dumps(todo), str(result)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh = json.loads(result.read_text())
    return {name: {**here[name], "fresh": fresh[name]} for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_a_fresh_process_restores_the_same_model(runs, name):
    case = runs[name]
    metrics, fresh = case["run"].metrics, case["fresh"]
    assert fresh["evaluate"].keys() == case["evaluate"].keys()
    for key, value in fresh["evaluate"].items():  # the figures of metrics.json: the model is the one released
        assert value == pytest.approx(metrics[key], abs=1e-6), key
        assert value == pytest.approx(case["evaluate"][key], abs=1e-6), key
    assert "test_rmse" in fresh["evaluate"] or "test_precision@10" in fresh["evaluate"]
    assert fresh["top"] == case["top"] and len(fresh["top"]) == 5
    seen = case["run"].folds[1].train
    u = case["run"]._user_index[_user(case["run"])]
    rated = {case["run"].dataset.item_ids[i] for i in seen.items[seen.users == u].tolist()}
    assert not rated & set(fresh["top"])


@pytest.mark.parametrize("name", list(CASES))
def test_the_release_file_holds_no_seed_generator_or_training_ratings(runs, name):
    run = runs[name]["run"]
    path = release_path(run.dir, 1)
    release = torch.load(path, weights_only=True)  # tensors and plain values only
    check_no_secrets(release["state"])
    train = run.folds[1].train
    for where, value in _walk(release):
        assert not isinstance(value, torch.Generator), where
        if where.rsplit(".", 1)[-1].lower().endswith("seed"):  # only the report's label of the noise's randomness
            assert value in ("secret", "explicit"), where
        if isinstance(value, int) and not isinstance(value, bool):
            assert value != SEED, where
        if isinstance(value, torch.Tensor):
            assert value.dtype != torch.uint8, f"{where}: an RNG state?"
            assert not (value.dim() == 1 and value.numel() == len(train)), f"{where}: one entry per training rating"
    meta = release["meta"]
    entry = meta["privacy"]["release"]
    assert entry["file"] == path.name and entry["covered_by_epsilon"] == (name in COVERED)
    assert run.metrics["privacy"]["release"]["covered_by_epsilon"] == (name in COVERED)
    assert meta["fold"] == 1 and meta["n_items"] == train.n_items
    assert not list(path.parent.glob(".release_fold1.pt.*.tmp"))  # written atomically: no temp file left


def test_restore_reads_the_item_side_from_the_release_and_the_user_side_from_the_ratings(runs):
    """The item side is exactly the release, whatever ratings are passed; each user's part follows their ratings."""
    run = runs["noisy_gram_lowrank_features"]["run"]
    model = run.model()
    assert isinstance(model, ReleasesState)
    state = read_release(release_path(run.dir, 1))["state"]
    train = run.folds[1].train
    assert torch.equal(model.item_avg_, state["item_means"]) and torch.equal(model.components_, state["components"])
    assert not torch.allclose(model.item_avg_, train.item_means().to(model.item_avg_.dtype))  # DP means, not the exact ones
    assert model.features_ is not None and state["item_features"] is True
    shifted = type(train)(train.users, train.items, (train.values + 1).clamp_max(5), train.n_users, train.n_items,
                          train.scale, meta=dict(train.meta))
    again = type(model)(epsilon=1.0, relation="user", estimator="lowrank", item_features="auto").restore(shifted, state)
    assert torch.equal(again.item_avg_, model.item_avg_) and torch.equal(again.components_, model.components_)
    assert torch.equal(again.fallback_.item_means_, state["fallback"]["item_means"])
    assert not torch.allclose(again.user_offset_, model.user_offset_)  # recomputed from the users' own ratings


def test_evaluate_py_run_scores_a_fitted_predictor_from_its_release(runs):
    from dprec_torch.training.evaluate import evaluate_run

    for name in ("noisy_gram", "cosine_implicit"):
        run = runs[name]["run"]
        metrics, table = evaluate_run(run.dir, torch.device("cpu"), compare_baselines=False)
        for key in [k for k in metrics if k.startswith("test_")]:
            assert metrics[key] == pytest.approx(run.metrics[key], abs=1e-6), (name, key)
        assert ("model RMSE" if name == "noisy_gram" else "precision@10") in table


def test_a_run_without_its_release_refuses_queries_and_a_damaged_one_is_one_line(runs, tmp_path):
    src = runs["pcc"]["run"].dir
    old = tmp_path / "old"
    shutil.copytree(src, old)
    release_path(old, 1).unlink()  # a run fitted before releases were written
    again = dprec_torch.load_run(old)
    assert again.models == {} and again.metrics["test_rmse"] > 0
    with pytest.raises(ConfigError, match="re-fit"):
        again.predict([0], [0])
    release_path(old, 1).write_bytes(b"not a release")
    with pytest.raises(ConfigError) as err:
        dprec_torch.load_run(old)
    assert "\n" not in str(err.value) and "release" in str(err.value)


def test_a_restored_output_mechanism_keeps_counting_what_it_released(runs):
    case = runs["slope_one_laplace_output"]
    fitted = case["run"].metrics["privacy"]
    restored = case["run"].model().privacy_report()  # after this process's evaluate() and recommend()
    assert restored["released_values"] > fitted["released_values"]
    assert restored["epsilon"] > fitted["epsilon"] and math.isfinite(restored["epsilon"])
