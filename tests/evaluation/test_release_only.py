"""A publishable release for every trained model.

Every training run writes ``release_fold<k>.pt`` (the model's parameters and the buffers it predicts with, a copy of
the privacy report, metadata; never generator state, a seed, a key or optimizer state). ``load_run``,
``evaluate.py run=``, ``Run.predict`` and ``Run.recommend`` read it and never the checkpoint, which holds the noise
key and is deleted at the end of a private run unless ``resume=true`` or ``keep_checkpoint=true``.
"""

from __future__ import annotations

import re
import secrets
import shutil
from pathlib import Path

import pytest
import torch

import dprec_torch
from dprec_torch.errors import ConfigError
from dprec_torch.evaluation.metrics import rating_metrics
from dprec_torch.predictors.release import check_no_secrets, release_path
from tests.helpers import walk as _walk

BASE = ["data=synthetic", "data.preset=tiny", "device=cpu", "tensorboard=false", "compare_baselines=false"]

#: every model x mechanism pair that trains (the config refuses dpsgd_paper and sgld_paper on the low-rank PNBM:
#: Alg. 1's bound and Alg. 2 as printed are the full S's); top-k PNBM once
PAIRS = [(model, mech) for model in ("pnbm", "pnbm_lowrank", "mf")
         for mech in ("none", "dpsgd", "sgld", "gaussian", "dpsgd_paper", "sgld_paper")
         if not (model == "pnbm_lowrank" and mech in ("dpsgd_paper", "sgld_paper"))] + [("pnbm_topk", "dpsgd_paper")]
EXTRA = {"pnbm_topk": ["model.sparse_k=20"]}
#: a state key named like secret randomness or resume state (``_extra_state`` is nn.Module's, the fallback's home)
SECRET_NAME = re.compile(r"rng|generator|seed|(^|[._])key($|[._])|optimi[sz]er|accountant|sampler|momentum|exp_avg|"
                         r"mean_release|noise_state", re.I)


def _train(out: Path, model: str, mech: str, *extra: str) -> dprec_torch.api.Run:
    eps = "epsilon=inf" if mech == "none" else "epsilon=5"
    return dprec_torch.train([*BASE, f"model={model}", f"mechanism={mech}", eps, "mechanism.epochs=1",
                              *EXTRA.get(model, []), *extra, f"output_dir={out}"])


def _no_checkpoint_reads(monkeypatch) -> None:
    """Any read of a checkpoint fails the test (load_run, predict, recommend and evaluate.py run= read releases)."""
    import dprec_torch.training.checkpoint as ck

    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint was read: releases only")

    monkeypatch.setattr(ck, "read_checkpoint", refuse)
    monkeypatch.setattr(ck, "load_checkpoint", refuse)
    original = torch.load

    def load(f, *args, **kwargs):
        assert "checkpoint" not in Path(str(f)).name, f"torch.load({f})"
        return original(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)


@pytest.mark.parametrize("model,mech", PAIRS, ids=[f"{m}-{k}" for m, k in PAIRS])
def test_every_checkpoint_deleted_the_run_still_loads_predicts_and_recommends(tmp_path, monkeypatch, model, mech):
    from dprec_torch.training.evaluate import evaluate_run

    run = _train(tmp_path / "run", model, mech)
    private = mech != "none"
    assert (run.dir / "checkpoint_fold1.pt").exists() == (not private)  # a private run deleted its secret checkpoint
    fold = run.folds[1]
    users = [run.dataset.user_ids[k] for k in fold.test.users.tolist()]
    items = [run.dataset.item_ids[k] for k in fold.test.items.tolist()]
    user = run.dataset.user_ids[int(fold.train.users[0])]
    expected_pred, expected_top = run.predict(users, items), run.recommend(user, n=5)

    for path in run.dir.glob("checkpoint_fold*.pt"):
        path.unlink()
    _no_checkpoint_reads(monkeypatch)
    again = dprec_torch.load_run(run.dir)
    assert set(again.models) == {1}
    pred = again.predict(users, items)
    assert torch.equal(pred, expected_pred)
    assert rating_metrics(pred, fold.test.values.cpu())["rmse"] == pytest.approx(run.metrics["test_rmse"], abs=1e-6)
    assert again.evaluate()["test_rmse"] == pytest.approx(run.metrics["test_rmse"], abs=1e-6)
    top = again.recommend(user, n=5)
    assert top == expected_top and len(top) == 5
    seen = {run.dataset.item_ids[i] for i in fold.train.items[fold.train.users == run._user_index[user]].tolist()}
    assert not seen & set(top)
    ev, _ = evaluate_run(run.dir, torch.device("cpu"), compare_baselines=False)  # evaluate.py run=
    assert ev["test_rmse"] == pytest.approx(run.metrics["test_rmse"], abs=1e-6) and ev["folds"][0]["epoch"] == 1

    entry = run.privacy["release"]
    assert entry["file"] == "release_fold1.pt" and "user_side" in entry
    assert entry["covered_by_epsilon"] == (run.privacy.get("epsilon") is not None and private and model != "pnbm_topk")


@pytest.mark.parametrize("model,mech", [("pnbm_lowrank", "sgld"), ("pnbm", "dpsgd"), ("mf", "gaussian"), ("mf", "none")])
def test_the_release_holds_the_model_and_no_generator_seed_key_or_optimizer_state(tmp_path, model, mech):
    run = _train(tmp_path, model, mech, "noise_seed=987654321")
    release = torch.load(release_path(run.dir, 1), weights_only=True)  # tensors and plain values only
    state, meta = release["state"], release["meta"]
    check_no_secrets(state)
    want = {"pnbm_lowrank": {"U", "item_means"}, "pnbm": {"S", "item_means"},
            "mf": {"global_bias", "mu_offset", "user_bias.weight", "item_bias.weight", "user_factors.weight",
                   "item_factors.weight"}}[model]
    assert set(state) == want | {"_extra_state"}
    model_obj = run.model()
    for name, value in model_obj.state_dict().items():  # exactly the model as released
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[name], value.cpu()), name
    for where, value in _walk(state):
        leaf = where.rsplit(".", 1)[-1]
        assert not SECRET_NAME.search(leaf), f"state{where}"
        assert not isinstance(value, (torch.Generator, bytes)), where
        if isinstance(value, torch.Tensor):
            assert value.dtype != torch.uint8, f"state{where}: an RNG state?"
    for where, value in _walk(meta):
        assert not isinstance(value, (torch.Tensor, torch.Generator, bytes)), f"meta{where}"
        if isinstance(value, int) and not isinstance(value, bool):
            assert value != 987654321, f"meta{where}: the noise seed"
        if "seed" in where.rsplit(".", 1)[-1].lower():  # only the report's label of the noise's randomness
            assert value in ("secret", "explicit"), f"meta{where}"
    assert meta["model"] == model and meta["mechanism"] == mech and meta["fold"] == 1 and meta["epochs"] == 1
    assert meta["n_items"] == run.folds[1].train.n_items and meta["n_users"] == run.folds[1].train.n_users
    assert meta["kind"] == "trained" and "seed" not in meta["model_config"]
    assert meta["privacy"]["mechanism"] == run.privacy["mechanism"] and meta["privacy"]["release"]["file"] == "release_fold1.pt"
    user_side = meta["privacy"]["release"]["user_side"]
    assert user_side.startswith("in the file" if model == "mf" else "not in the file")
    assert not list(run.dir.glob(".release_fold1.pt.*.tmp"))  # written atomically


def test_no_byte_of_the_secret_key_reaches_the_release(tmp_path, monkeypatch):
    """The OS entropy the run draws is a sentinel: it (and the key it seeds) may be in the checkpoint only."""
    drawn: list[bytes] = []

    def token_bytes(n: int = 32) -> bytes:
        drawn.append(bytes((0xA5 ^ (7 * k + len(drawn))) & 0xFF for k in range(n)))
        return drawn[-1]

    def randbits(k: int) -> int:
        return int.from_bytes(token_bytes((k + 7) // 8), "big") >> (8 * ((k + 7) // 8) - k)

    monkeypatch.setattr(secrets, "token_bytes", token_bytes)
    monkeypatch.setattr(secrets, "randbits", randbits)
    run = _train(tmp_path, "pnbm_lowrank", "sgld", "keep_checkpoint=true")
    assert drawn, "the run drew no secret"
    data = release_path(run.dir, 1).read_bytes()
    for key in drawn:
        for form in (key, key.hex().encode(), str(int.from_bytes(key, "big")).encode()):
            assert form not in data, "the release holds a secret"


@pytest.mark.parametrize("extra,kept", [((), False), (("keep_checkpoint=true",), True), (("resume=true",), True)])
def test_a_private_run_deletes_its_checkpoint_unless_asked_to_keep_it(tmp_path, extra, kept):
    run = _train(tmp_path, "pnbm_lowrank", "dpsgd", *extra)
    assert (run.dir / "checkpoint_fold1.pt").exists() == kept
    assert release_path(run.dir, 1).exists() and (run.dir / "metrics.json").exists()
    statement = " ".join(run.privacy["scope"]["not_covered"])
    assert "checkpoint_fold*.pt: SECRET" in statement and "keep_checkpoint=true" in statement


def test_a_non_private_run_keeps_its_checkpoint(tmp_path):
    run = _train(tmp_path, "pnbm_lowrank", "none")
    assert (run.dir / "checkpoint_fold1.pt").exists() and release_path(run.dir, 1).exists()


def test_every_fold_of_a_run_is_released_and_loads_without_checkpoints(tmp_path, monkeypatch):
    run = _train(tmp_path, "mf", "dpsgd", "data.fold=all", "data.n_folds=2")
    assert sorted(p.name for p in run.dir.glob("*.pt")) == ["release_fold1.pt", "release_fold2.pt"]
    _no_checkpoint_reads(monkeypatch)
    again = dprec_torch.load_run(run.dir)
    assert set(again.models) == {1, 2}
    assert again.evaluate()["test_rmse"] == pytest.approx(run.metrics["test_rmse"], abs=1e-6)


def test_a_killed_private_run_keeps_its_checkpoint_and_resumes(tmp_path, monkeypatch):
    """Deletion waits for metrics.json and the release: a run killed in its last epoch keeps its checkpoint."""
    from tests.helpers import kill_in_epoch
    from dprec_torch.training import trainer as trainer_mod

    args = ("noise_seed=3", "mechanism.epochs=2")
    full = _train(tmp_path / "full", "pnbm", "dpsgd", *args)
    original = kill_in_epoch(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path / "cut", "pnbm", "dpsgd", *args, "resume=true")
    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", original)
    assert (tmp_path / "cut" / "checkpoint_fold1.pt").exists() and not release_path(tmp_path / "cut", 1).exists()
    resumed = _train(tmp_path / "cut", "pnbm", "dpsgd", *args, "resume=true")
    assert resumed.metrics["test_rmse"] == full.metrics["test_rmse"]
    assert (tmp_path / "cut" / "checkpoint_fold1.pt").exists()  # resume=true keeps it


def test_resume_of_a_finished_private_fold_whose_checkpoint_is_gone_is_refused(tmp_path):
    """Training it again would release the same people a second time with fresh noise."""
    run = _train(tmp_path, "pnbm_lowrank", "dpsgd")
    before = release_path(run.dir, 1).read_bytes()
    with pytest.raises(ConfigError, match=r"already finished and was released .*nothing to resume") as err:
        _train(tmp_path, "pnbm_lowrank", "dpsgd", "resume=true")
    assert "\n" not in str(err.value) and release_path(run.dir, 1).read_bytes() == before


def test_a_trained_run_without_its_release_refuses_queries(tmp_path):
    run = _train(tmp_path / "run", "pnbm", "dpsgd")
    old = tmp_path / "old"
    shutil.copytree(run.dir, old)
    release_path(old, 1).unlink()  # a run trained before releases were written
    again = dprec_torch.load_run(old)
    assert again.models == {} and again.metrics["test_rmse"] > 0
    with pytest.raises(ConfigError, match="before releases were written"):
        again.recommend(run.dataset.user_ids[0], n=3)


def test_keep_checkpoint_is_a_boolean():
    from dprec_torch.api import compose_config
    from dprec_torch.config import check_config

    assert compose_config([]).keep_checkpoint is False
    with pytest.raises(ConfigError, match="keep_checkpoint"):
        check_config(compose_config(["keep_checkpoint=maybe"]))
