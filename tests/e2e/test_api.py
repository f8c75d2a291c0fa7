"""The Python API (dprec_torch/api.py, docs/python_api.md): the documented example runs, load_run restores
exactly the released model (never re-fitted), ids are raw ids, and import dprec_torch stays cheap."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dprec_torch
from dprec_torch.data.ratings import Fold, RatingDataset, Ratings, RatingScale
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.evaluation.metrics import rating_metrics

pytestmark = pytest.mark.e2e  # whole runs: -m e2e selects them, -m 'not e2e' leaves them out

ROOT = Path(__file__).resolve().parents[2]
BASE = ["data=synthetic", "device=cpu", "tensorboard=false", "compare_baselines=false"]


def python_block(path: Path) -> str:
    """The first ```python block of a markdown file."""
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    assert blocks, f"no ```python block in {path}"
    return blocks[0]


@pytest.mark.parametrize("doc", ["docs/python_api.md", "README.md"])  # README: its "Python API" section
def test_documented_example_runs(tmp_path, monkeypatch, doc):
    monkeypatch.chdir(tmp_path)  # the example writes outputs/<date>/... under the working directory
    exec(compile(python_block(ROOT / doc), doc, "exec"), {})
    assert len(list((tmp_path / "outputs").glob("*/*/metrics.json"))) == 1


@pytest.mark.parametrize("model,mechanism,epochs", [("pnbm", "dpsgd", 2), ("mf", "dpsgd", 1)])
def test_load_run_reproduces_the_test_rmse_exactly(tmp_path, model, mechanism, epochs):
    run = dprec_torch.train([*BASE, f"model={model}", f"mechanism={mechanism}", "epsilon=2",
                             f"mechanism.epochs={epochs}", f"output_dir={tmp_path}"])
    assert run.dir == tmp_path and run.privacy["epsilon"] == pytest.approx(2.0)  # a provable form: typed = defended
    again = dprec_torch.load_run(tmp_path)
    assert again.evaluate()["test_rmse"] == run.metrics["test_rmse"]  # bit for bit, not approx
    assert again.evaluate()["test_mae"] == run.metrics["test_mae"]
    # the same figure through the raw-id API: predict every test pair of the fold
    fold = again.folds[1]
    users = [again.dataset.user_ids[k] for k in fold.test.users.tolist()]
    items = [again.dataset.item_ids[k] for k in fold.test.items.tolist()]
    pred = again.predict(users, items)
    assert rating_metrics(pred, fold.test.values.cpu())["rmse"] == run.metrics["folds"][0]["test_rmse"]
    assert not (tmp_path / "checkpoint_fold1.pt").exists()  # private: the secret checkpoint is gone
    if model == "pnbm":  # the DP item means come from the release; attach() would recompute the exact ones
        restored = again.model().item_means
        assert not torch.allclose(restored, fold.train.item_means().to(restored.dtype))
        release = torch.load(tmp_path / "release_fold1.pt", weights_only=True)
        assert torch.equal(restored, release["state"]["item_means"])


def test_recommend_excludes_seen_items_and_speaks_raw_ids(tmp_path):
    run = dprec_torch.train([*BASE, "model=mf", "mechanism=none", "epsilon=inf", "mechanism.epochs=1",
                             f"output_dir={tmp_path}"])
    train = run.folds[1].train
    u = int(train.users[0])
    raw_user = run.dataset.user_ids[u]
    seen = {run.dataset.item_ids[i] for i in train.items[train.users == u].tolist()}
    top = run.recommend(raw_user, n=5)
    assert len(top) == 5 and not seen & set(top)
    everything = run.recommend(raw_user, n=len(run.dataset.item_ids), exclude_seen=False)
    assert len(everything) == len(run.dataset.item_ids)
    scores = run.predict(raw_user, everything)  # best first
    assert bool((scores[:-1] >= scores[1:]).all())
    with pytest.raises(DataError):
        run.recommend("no such user", n=3)
    with pytest.raises(ConfigError):
        run.recommend(raw_user, n=0)


class _Echo(torch.nn.Module):
    """Predicts 10 * user index + item index, so the test reads back which indices it was given."""

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return (10 * users + items).float()


def test_predict_maps_raw_ids_to_indices_and_unknown_ids_to_the_fallback():
    train = Ratings(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([4.0, 3.0]), 2, 3, RatingScale(1, 5))
    data = RatingDataset("toy", [Fold(1, train, train)], ["u7", "u9"], [101, 102, 103], RatingScale(1, 5))
    run = dprec_torch.Run(Path("."), None, {"privacy": {"epsilon": None}}, data, {1: _Echo()}, {1: data.folds[0]})
    assert run.predict(["u9", "u7"], [103, 101]).tolist() == [12.0, 0.0]
    assert run.predict("u9", [101, 102]).tolist() == [10.0, 11.0]  # a scalar broadcasts
    assert run.predict(["u7"], torch.tensor([102])).tolist() == [1.0]  # a tensor of raw ids is read by value
    assert run.predict(["nobody"], [999]).tolist() == [-11.0]  # -1, -1: the model's fallback answers them
    assert run.privacy == {"epsilon": None}


def test_a_fitted_predictor_run_is_restored_from_its_release(tmp_path):
    """Fitted predictors are restored from release_fold<k>.pt (tests/evaluation/test_releases.py covers every model)."""
    run = dprec_torch.train([*BASE, "model=pcc", "mechanism=none", "model.k=20", f"output_dir={tmp_path}"])
    assert run.metrics["test_rmse"] > 0 and set(run.models) == {1}
    assert run.evaluate()["test_rmse"] == run.metrics["test_rmse"]
    (tmp_path / "release_fold1.pt").unlink()  # a run fitted before releases were written
    with pytest.raises(ConfigError, match="re-fit"):
        dprec_torch.load_run(tmp_path).predict([0], [0])


def test_bad_override_is_one_config_error_line():
    with pytest.raises(ConfigError) as err:
        dprec_torch.train([*BASE, "mechanism.lerning_rate=0.1"])
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        dprec_torch.load_run(ROOT / "conf")  # not a run dir


def test_import_is_cheap_and_the_conf_dir_is_found_from_anywhere(tmp_path):
    code = ("import sys, dprec_torch; assert 'torch' not in sys.modules and 'hydra' not in sys.modules; "
            "cfg = dprec_torch.compose_config(['data=synthetic']); print(cfg.data.name)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("synthetic")
