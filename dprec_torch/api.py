"""The Python API: train and query a recommender from a notebook (docs/python_api.md).

    import dprec_torch
    run = dprec_torch.train(["data=synthetic", "mechanism=dpsgd", "epsilon=2"])   # = python train.py ...
    run.metrics["test_rmse"], run.privacy["epsilon"]
    print(run.table())                                   # the model beside non-private PCC/COS (and DP means at its epsilon)
    run.predict([0, 1], [10, 20]); run.recommend(0, n=5)
    again = dprec_torch.load_run(run.dir)        # the released models, restored from release_fold<k>.pt

* :func:`train` composes ``conf/config.yaml`` with the overrides exactly as ``train.py`` does (the same Hydra config,
  the same validation, the same ``train(cfg)``), writes the run dir, then returns :func:`load_run` of it -- so a
  :class:`Run` from ``train`` and one from ``load_run`` are the same thing.
* :func:`load_run` never re-fits and never reads a checkpoint (``checkpoint_fold<k>.pt`` is secret resume state,
  deleted at the end of a private run): each trained model (:func:`dprec_torch.training.evaluate.restore_fold`: U / S /
  the factors, the item means -- the DP release where the mechanism made one -- and the fallback) and each fitted
  predictor (:func:`dprec_torch.training.evaluate.restore_predictor`: its item side) is RESTORED from its release
  ``release_fold<k>.pt``; each user's own part -- offset, factors, history -- is recomputed from that user's ratings in
  the run's training split, as the privacy report's ``release`` entry says.
* Ids are the RAW ids of the data files (MovieLens user 1 is ``1``; synthetic data's raw ids are 0..n-1), never the
  contiguous indices the models use inside. In :meth:`Run.predict` an id the data never had gets the model's
  documented fallback (item mean, then global mean); in :meth:`Run.recommend` an unknown user is an error.

A run from before releases were written has no ``release_fold<k>.pt``: its :class:`Run` gives ``metrics`` and
``privacy`` but refuses ``predict`` and ``recommend`` (re-fitting would be a different release). Under an output
mechanism (``laplace_output``, ``exponential_topk``) and for PNCF every answer draws fresh noise, as the mechanism
prescribes (secret, or from the explicit ``noise_seed``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dprec_torch.cli import check_command_line
from dprec_torch.config import CONF_DIR, instantiate_node
from dprec_torch.data.ratings import Fold, RatingDataset
from dprec_torch.device import resolve_device
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.training.checkpoint import upgrade_recorded
from dprec_torch.training.evaluate import restore_fold, restore_predictor, score_restored
from dprec_torch.training.run import comparison_table, is_trainable, job_label, train as train_cfg
from dprec_torch.training.tb_close import wait_closed
from dprec_torch.evaluation.baselines import reference_label
from dprec_torch.evaluation.cross_validate import score_predictor
from dprec_torch.interfaces import Recommender
from dprec_torch.seeding import key_scope

__all__ = ["Run", "compose_config", "load_run", "train"]


# ----------------------------------------------------------------------------------------- config
def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides`` (Hydra's compose API, the composition ``train.py`` does).

    The conf dir ships next to the package (``<repo>/conf``: found from a checkout and from an editable
    install, :data:`dprec_torch.config.CONF_DIR`). A bad override (unknown group option, misspelt key,
    out-of-range value) raises :class:`ConfigError` with one line, as the CLI prints it.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    if not (CONF_DIR / "config.yaml").is_file():
        raise ConfigError(f"no conf/config.yaml at {CONF_DIR}: dprec_torch.train needs the repository's conf/ "
                          "next to the package (pip install -e <repo>)")
    overrides = [str(o) for o in overrides]
    check_command_line("config", overrides)  # one readable line for a bad override (the CLI's own check)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            return compose(config_name="config", overrides=overrides)
        except HydraException as err:  # e.g. a sweep (a,b) that the check took the first value of
            raise ConfigError(f"cannot compose {overrides}: {str(err).splitlines()[0]}") from None


def fresh_output_dir(root: Path | str = "outputs") -> Path:
    """A new run dir ``<root>/<date>/<time>-<unique>`` (train.py's layout, never shared by two calls)."""
    day = Path(root) / time.strftime("%Y-%m-%d")
    day.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%H-%M-%S-"), dir=day))


# ----------------------------------------------------------------------------------------- the run
def _ids(ids: Any) -> np.ndarray:
    """Raw ids as an object array of plain Python values (a tensor's elements would not match the id map)."""
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        ids = ids.tolist()
    return np.asarray(ids, dtype=object)


@dataclass
class Run:
    """A finished ``train.py`` run: its config, ``metrics.json``, and each fold's released model.

    Attributes:
        dir: the run dir.
        config: the resolved config the run was trained under (``config_resolved.json``).
        metrics: ``metrics.json`` (``test_rmse``, ``test_mae``, per-fold records, ``privacy``, ``baselines``, ...).
        dataset: the data as loaded (raw-id maps, folds).
        models: fold index -> the restored model (a trained ``nn.Module`` or a fitted predictor, from its
            ``release_fold<k>.pt``); empty for a run from before releases were written (see the module doc).
        folds: fold index -> the fold as loaded (train/test ratings, contiguous indices).
        device: where the models and folds live.
    """

    dir: Path
    config: DictConfig
    metrics: dict[str, Any]
    dataset: RatingDataset
    models: dict[int, Any] = field(default_factory=dict)
    folds: dict[int, Fold] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    job: str | None = None  # the run's job label of its noise keys (training.run.job_label)

    def __post_init__(self) -> None:
        self._user_index = {raw: k for k, raw in enumerate(self.dataset.user_ids)}
        self._item_index = {raw: k for k, raw in enumerate(self.dataset.item_ids)}

    @property
    def privacy(self) -> dict[str, Any]:
        """The mechanism's privacy report (relation, sensitivity, noise, accountant and the defended ``epsilon``)."""
        return self.metrics["privacy"]

    @property
    def baselines(self) -> dict[str, dict[str, float]]:
        """The references scored beside the model on the same test folds and k (``metrics.json["baselines"]``, name ->
        ``rmse``/``mae``/...; :attr:`baseline_labels` says which is which; empty with ``compare_baselines=false``).
        Test metrics, which epsilon does not cover."""
        return self.metrics.get("baselines", {})

    @property
    def baseline_labels(self) -> dict[str, str]:
        """Reference name -> how tables label it (``"PCC (non-private reference)"``, ...)."""
        return {name: reference_label(name, self.metrics.get("baseline_info")) for name in self.baselines}

    def table(self) -> str:
        """The comparison table ``train.py`` prints at its end: the model's test RMSE/MAE, then each labelled reference."""
        return comparison_table(self.metrics)

    def model(self, fold: int | None = None) -> Any:
        """The released model of ``fold`` (default: the run's first fold)."""
        if not self.models:
            raise ConfigError(
                f"run {self.dir} trained or fitted model={self.config.model.get('name')} before releases were written (no "
                "release_fold<k>.pt): it cannot be queried without re-fitting (load_run never re-fits); its metrics "
                "and privacy are here")
        key = next(iter(self.models)) if fold is None else int(fold)
        if key not in self.models:
            raise ConfigError(f"run {self.dir} has folds {sorted(self.models)}, not {fold}")
        return self.models[key]

    def _keys(self, fold: int | None) -> Any:
        """The noise-key scope the run answered ``fold`` under (``run_experiment``'s ``key_scope(job, fold)``): a restored
        output mechanism or PNCF with an explicit ``noise_seed`` then repeats the run's answers, query for query."""
        if self.job is None or not self.models:
            return contextlib.nullcontext()
        return key_scope(job=self.job, fold=next(iter(self.models)) if fold is None else int(fold))

    def _indices(self, index: dict[Any, int], ids: Iterable[Any]) -> torch.Tensor:
        """The contiguous indices of raw ``ids`` (-1: an id the data never had)."""
        return torch.tensor([index.get(x, -1) for x in ids], dtype=torch.long, device=self.device)

    def predict(self, users: Any, items: Any, fold: int | None = None) -> torch.Tensor:
        """Predicted ratings for the pairs (users[k], items[k]) of RAW ids, clipped to the rating scale (float32, CPU).

        A scalar broadcasts against a list (``run.predict(1, [10, 20, 30])``). Predictions for user u also read u's own
        training ratings (PNBM's Eq. (2)): the guarantee is joint DP, as the privacy report says.
        """
        model = self.model(fold)
        # every trained model and rating predictor has predict; D2P and exponential_topk only recommend
        if not callable(getattr(model, "predict", None)):
            raise ConfigError(f"model={self.config.model.get('name')} only recommends (it predicts no ratings): "
                              "use run.recommend(user, n)")
        u, i = np.broadcast_arrays(_ids(users), _ids(items))
        with self._keys(fold):
            out = model.predict(self._indices(self._user_index, u.ravel().tolist()), self._indices(self._item_index, i.ravel().tolist()))
        return out.detach().float().cpu()

    def recommend(self, user: Any, n: int = 10, exclude_seen: bool = True, fold: int | None = None) -> list[Any]:
        """The ``n`` items with the highest predicted rating for ``user`` (a RAW id), best first, as RAW item ids.

        ``exclude_seen`` drops the items the user rated in the fold's training data. Ties go to the item listed first in
        the data. Post-processing of the released model and the user's own ratings. A model that ranks by its own rule
        (``task`` topn or both: Slope One, McSherry-Mironov, PNCF, D2P, an output mechanism) gives its own top-n list,
        as the run's top-N metrics scored it; it ranks unseen items only.
        """
        if int(n) != n or n < 1:
            raise ConfigError(f"recommend n={n} must be an integer >= 1")
        user = _ids(user).item()
        if user not in self._user_index:
            raise DataError(f"user {user!r} is not in {self.dataset.name} (raw ids as in the data files, e.g. "
                            f"{self.dataset.user_ids[0]!r})")
        model, dev = self.model(fold), self.device
        u = self._user_index[user]
        if isinstance(model, Recommender) and model.task in ("topn", "both"):
            if not exclude_seen:
                raise ConfigError(f"model={self.config.model.get('name')} ranks the items a user has not rated: "
                                  "use exclude_seen=True")
            with self._keys(fold):
                top = model.recommend(torch.tensor([u], dtype=torch.long, device=dev), int(n))[0].tolist()
            return [self.dataset.item_ids[k] for k in top if k >= 0]
        if not callable(getattr(model, "predict", None)):
            raise ConfigError(f"model={self.config.model.get('name')} has neither recommend nor predict")
        n_items = len(self.dataset.item_ids)
        items = torch.arange(n_items, device=dev)
        with self._keys(fold):
            scores = model.predict(torch.full((n_items,), u, dtype=torch.long, device=dev), items).detach().double()
        if exclude_seen:
            train = self.folds[next(iter(self.folds)) if fold is None else int(fold)].train
            scores[train.items[train.users == u].to(dev)] = float("-inf")  # the items u rated
        order = torch.sort(scores, descending=True, stable=True).indices
        order = order[torch.isfinite(scores[order])][: int(n)]
        return [self.dataset.item_ids[k] for k in order.tolist()]

    def evaluate(self) -> dict[str, float]:
        """Re-score every restored model on its test fold: ``test_rmse`` / ``test_mae`` (and a recommender's top-N
        metrics, with the run's ``eval.topn``) averaged over folds as ``metrics.json`` does (equal to the run's own
        figures: the model is the one released; an output mechanism or PNCF draws fresh noise per answer)."""
        trainable = is_trainable(self.config.model)
        per_fold = []
        for k in (self.models or [None]):
            with self._keys(k):
                per_fold.append(score_predictor(self.model(k), self.folds[k]) if trainable
                                else score_restored(self.config, self.model(k), self.folds[k]))
        keys = [m for m in per_fold[0] if m in ("rmse", "mae") or "@" in m or m == "coverage"]
        return {f"test_{m}": float(np.mean([f[m] for f in per_fold])) for m in keys}


# ----------------------------------------------------------------------------------------- entry points
def load_run(run_dir: str | Path, device: str | None = None) -> Run:
    """The run in ``run_dir`` (a ``train.py`` or :func:`train` output dir) with each fold's released model restored.

    Reads ``config_resolved.json`` and ``metrics.json``, reloads the data the config names, and restores every fold's
    model from its release ``release_fold<k>.pt`` on ``device`` (default: the run's own ``device``) as the module doc
    says. A run from before releases were written has none: its :class:`Run` has no models.
    """
    from dprec_torch.predictors.release import release_path

    run_dir = Path(run_dir)
    cfg_path, metrics_path = run_dir / "config_resolved.json", run_dir / "metrics.json"
    if not cfg_path.exists():
        raise ConfigError(f"{run_dir} is not a train.py run dir (no config_resolved.json)")
    if not metrics_path.exists():
        raise ConfigError(f"{run_dir} holds no metrics.json: the run did not finish (resume it with resume=true)")
    cfg = upgrade_recorded(OmegaConf.create(json.loads(cfg_path.read_text())))
    metrics = json.loads(metrics_path.read_text())
    dev = resolve_device(device or cfg.get("device", "auto"))
    dataset = instantiate_node(cfg.data)
    models: dict[int, Any] = {}
    folds: dict[int, Fold] = {}
    job = job_label(cfg)
    for fold in dataset.folds:
        folds[fold.index] = fold.to(dev)  # as loaded: recommend's "seen" items are all of u's training ratings
        if not release_path(run_dir, fold.index).is_file():  # a run from before releases were written
            continue
        with key_scope(job=job, fold=fold.index):  # the keys the run restored under (run_experiment)
            if is_trainable(cfg.model):  # trained on the fold as its mechanism capped it (restore_fold re-caps it)
                models[fold.index] = restore_fold(cfg, fold, run_dir, dev)[1]
            else:  # fitted on the fold as loaded (fit_fold)
                models[fold.index] = restore_predictor(cfg, folds[fold.index], run_dir, dev)
    return Run(run_dir, cfg, metrics, dataset, models, folds, dev, job)


def train(overrides: Sequence[str] | DictConfig = ()) -> Run:
    """Train as ``python train.py <overrides>`` does and return the :class:`Run` (see :func:`load_run`).

    ``overrides``: Hydra overrides (``["mechanism=sgld", "epsilon=20"]``), or a config already composed
    from ``conf/config.yaml`` (:func:`compose_config`; it is copied, not changed). The run dir is
    ``output_dir=`` when given, else a fresh ``outputs/<date>/<time>-<unique>`` under the working directory.
    """
    cfg = copy.deepcopy(overrides) if isinstance(overrides, DictConfig) else compose_config(list(overrides))
    if not cfg.get("output_dir"):
        cfg.output_dir = str(fresh_output_dir())
    try:
        train_cfg(cfg)
    finally:
        wait_closed()  # the run's TensorBoard logs are complete when it returns (they are closed in the background)
    return load_run(cfg.output_dir, device=str(cfg.get("device", "auto")))
