"""``train(cfg)``: the plain function behind ``train.py`` (tests call it directly).

Reads top to bottom: validate the config, load the data, then per fold either train a model under its mechanism (PNBM,
MF) or fit a predictor (kNN, Slope One, PNCF, ...), score it, compare with PCC/COS, and write ``metrics.json``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from dprec_torch.data.custom import check_scale_declared
from dprec_torch.data.ratings import Fold, RatingDataset
from dprec_torch.device import claimed_device, set_matmul_precision
from dprec_torch.config import RUNNER_KEYS, accepted, check_config, declared_parameters, form_node, instantiate_node, resolve_model_node  # noqa: F401
from dprec_torch import forms
from dprec_torch.forms import mechanism_class as form_class
from dprec_torch.data.defaults import fill_dataset_defaults
from dprec_torch.errors import ConfigError
from dprec_torch.evaluation.cross_validate import score_predictor
from dprec_torch.interfaces import LeavesPredictorAsFitted, OutputMechanism, ReportsPrivacy, TrainableModel
from dprec_torch.io import atomic_write_json
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.context import TrainingContext, gradient_reduction_of, prior_precision_for
from dprec_torch.models.base import BaseModel
from dprec_torch.models.batching import PoissonBatchSampler, poisson_steps_per_epoch
from dprec_torch.privacy_harness.registry import check_claim
from dprec_torch.privacy.provenance import hyperparameter_provenance
from dprec_torch.privacy.relations import check_privacy_units, check_relation_preprocessing, node_relation
from dprec_torch.privacy import size_rule
from dprec_torch.privacy.scope import diagnostics_enabled, item_universe_of, privacy_scope, reference_scope
from dprec_torch.seeding import SAMPLER_STREAM, key_scope, noise_generator, randomness_report, seed_everything
from dprec_torch.startup import skip_dynamo_import, summary_writer_class
from dprec_torch.sweep_cache import shared
from dprec_torch.evaluation.baselines import (baseline_metrics, dp_reference_metrics, dp_reference_target, log_references, reference_hparams,
                                              reference_info, reference_label)
from dprec_torch.training.checkpoint import check_nothing_released, discard_secret_checkpoints, load_checkpoint, prepare_run_dir
from dprec_torch.training.private_selection import SELECT_KEYS, check_selection, select_fold, selects_privately
from dprec_torch.training.trainer import Trainer

log = logging.getLogger(__name__)


def output_dir(cfg: DictConfig) -> Path:
    """``cfg.output_dir`` if set, else the Hydra run dir."""
    if cfg.get("output_dir"):
        return Path(cfg.output_dir)
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def validate(cfg: DictConfig) -> None:
    """Checks that must fail before any data is read: every key and number of the composed config
    (:func:`dprec_torch.config.check_config`), then the dataset-dependent defaults (``baseline_k`` and
    the PCC/COS ``model.k`` of ``null`` become the paper's k for the dataset: 900 on ML-100K, 1300 on ML-1M)."""
    check_config(cfg)
    check_relation_preprocessing(cfg)
    fill_dataset_defaults(cfg)
    # a mechanism x model pair the classes cannot train is one line before any data is read
    if is_trainable(cfg.model):
        mechanism = training_mechanism(cfg)
        model = get_class(forms.model_target(resolve_model_node(cfg.model)))
        if need := form_class(mechanism, model).model_lacks(model):  # one line, before any data is read
            raise ConfigError(f"mechanism={cfg.mechanism.get('name', '?')} needs a model with {need}(); {model.__name__} has none")
        check_selection(cfg, mechanism)
    else:
        wrapped_by_mechanism(cfg)


def is_trainable(model_cfg: DictConfig) -> bool:
    """Models learned under a mechanism are ``nn.Module``s; everything else is a fitted predictor."""
    try:
        return issubclass(get_class(model_cfg._target_), torch.nn.Module)
    except Exception as err:  # noqa: BLE001 - report a bad _target_ as a config error
        raise ConfigError(f"cannot import model target '{model_cfg.get('_target_')}': {err}") from err


def build_model(cfg: DictConfig, fold: Fold, device: torch.device | None = None) -> TrainableModel:
    """The model of ``cfg.model`` for ``fold``; a model that takes ``device`` initialises its parameters there."""
    node = resolve_model_node(cfg.model)
    cls = get_class(node._target_)
    model = instantiate_node(node, **accepted(cls, n_items=fold.train.n_items, n_users=fold.train.n_users, device=device))
    if not isinstance(model, TrainableModel):
        raise ConfigError(f"model={cfg.model.get('name', cls.__name__)} is an nn.Module but not a TrainableModel "
                          f"(dprec_torch/interfaces.py: attach, restore, batch_predict, surrogate_loss, ...)")
    if not isinstance(model, BaseModel):  # the runner, Trainer and mechanisms read its capability defaults directly
        raise ConfigError(f"model={cfg.model.get('name', cls.__name__)} must subclass dprec_torch.models.base.BaseModel")
    return model


TRAINING_KEYS = "mechanism=none|dpsgd|sgld|gaussian|dpsgd_paper"


def mechanism_class(cfg: DictConfig) -> type:
    """The class ``cfg.mechanism`` names (every ``conf/mechanism/*.yaml`` names one)."""
    if not cfg.mechanism.get("_target_"):
        raise ConfigError(f"mechanism={cfg.mechanism.get('name', '?')} names no class (no _target_): choose a "
                          "mechanism from conf/mechanism/")
    return get_class(cfg.mechanism._target_)


def training_mechanism(cfg: DictConfig) -> type[MechanismOptimizer]:
    """The class of ``cfg.mechanism``, which must be a training mechanism (a :class:`MechanismOptimizer`,
    the base that declares every :class:`~dprec_torch.interfaces.TrainingMechanism` attribute). The class that then
    trains a given model is :func:`dprec_torch.forms.mechanism_class` of it (``setup_training``)."""
    if not cfg.mechanism.get("_target_"):
        raise ConfigError(f"model={cfg.model.get('name', '?')} is trained by a mechanism; choose {TRAINING_KEYS}")
    cls = get_class(cfg.mechanism._target_)
    if isinstance(cls, type) and issubclass(cls, MechanismOptimizer):
        return cls
    if isinstance(cls, type) and issubclass(cls, LeavesPredictorAsFitted):
        raise ConfigError(f"mechanism={cfg.mechanism.get('name', cls)} is a fitted predictor's own mechanism (model=pncf|"
                          f"mcsherry|d2p|dpals|noisy_gram); model={cfg.model.get('name', '?')} is trained: choose {TRAINING_KEYS}")
    raise ConfigError(f"mechanism={cfg.mechanism.get('name', cls)} privatises fitted predictors; model="
                      f"{cfg.model.get('name', '?')} is trained: choose {TRAINING_KEYS}")


def mechanism_fold(cfg: DictConfig, fold: Fold) -> Fold:
    """The fold a mechanism trains on: a mechanism configured to defend users caps each user at tau ratings
    (seeded); then delta is checked against the fold's privacy units (:func:`check_fold_units`)."""
    training_mechanism(cfg)
    # the CONFIGURED relation (mechanism.relation / unit), not the class default, of the model's form
    if node_relation(cfg.mechanism, cfg.model) == "user" and cfg.mechanism.get("max_user_ratings"):
        from dprec_torch.data.preprocess import cap_seed, cap_user_ratings

        tau = int(cfg.mechanism.max_user_ratings)
        # per-user keys from the raw ids (the loader's id map): u's capped profile depends on u alone
        train, dropped = cap_user_ratings(fold.train, tau, cap_seed(int(cfg.seed), fold.index))
        log.info("capped every user at tau=%d training ratings for the user-level bound (dropped %d)", tau, dropped)
        fold = Fold(fold.index, train, fold.test, fold.name)
    check_fold_units(cfg, fold)
    return fold


def check_fold_units(cfg: DictConfig, fold: Fold) -> None:
    """delta below 1/(privacy units of the fold's train side): its ratings, or its users with a rating."""
    check_privacy_units(cfg, len(fold.train), int((fold.train.user_counts() > 0).sum()))


@dataclass
class TrainingSetup:
    """Everything one fold's training needs, built from the config (the tests build it the same way)."""

    fold: Fold
    model: torch.nn.Module
    sampler: PoissonBatchSampler
    optimizer: Any
    epochs: int
    rule: dict[str, Any] | None = None  # the size rule's record when it set any knob (privacy/size_rule.py)


def masked_steps(model: BaseModel, device: torch.device) -> bool:
    """Whether a user-level step runs on one fixed full batch with its sampled users marked (:attr:`.UserBatch.row_mask`;
    at q = 1 the same batch, unmasked): off the CPU, for a model that allows it. The same users and numbers as a
    compacted batch (a test checks the bits on the CPU); on a GPU no step waits for the device to size its batch, and
    the batch's row offsets let the GPU kernels run. The CPU keeps compacted batches: its kernels do q x the work."""
    return device.type != "cpu" and bool(model.masked_batches)


def setup_training(cfg: DictConfig, fold: Fold, device: torch.device, prepare: bool = True) -> TrainingSetup:
    """Cap the fold for the mechanism, build and attach the model, build the mechanism (it calibrates), let it prepare
    the model (:meth:`~dprec_torch.mechanisms.base.MechanismOptimizer.prepare`: the DP item means, S's start), then build
    the batch sampler. ``prepare=False`` for a resumed fold: its checkpoint restores what ``prepare`` made."""
    skip_dynamo_import()  # torch.optim's first call would import torch._dynamo: 2-6 s no run uses (dprec_torch/startup.py)
    fold = mechanism_fold(cfg, fold)
    train = fold.train
    cfg, rule = size_rule.apply(cfg, train)  # knobs set to `auto`: the size rule's values for this fold's public sizes
    model = build_model(cfg, fold, device).to(device)
    model.attach(train)
    mech_cls = form_class(training_mechanism(cfg), model)  # the class that trains this model (dprec_torch.forms.FORMS)
    ratio = float(cfg.mechanism.get("sampling_ratio", 1.0))
    unit = cfg.mechanism.get("unit") or ("user" if mech_cls.relation == "user" else "rating")
    epochs, steps = int(cfg.mechanism.epochs), poisson_steps_per_epoch(ratio)
    prior = prior_precision_for(mech_cls, model, train, ratio * len(train))
    context = TrainingContext(total_steps=epochs * steps, steps_per_epoch=steps, n_ratings=len(train), n_users=train.n_users,
                              scale=train.scale, max_user_ratings=cfg.mechanism.get("max_user_ratings"),
                              entry_bound=model.gradient_entry_bound, prior_precision=prior, model=model,
                              n_units=len(train) if unit == "rating" else train.n_users,  # MF's lr is per example: G / (q n_units)
                              expected_batch_size=ratio * (len(train) if unit == "rating" else train.n_users),
                              gradient_reduction=gradient_reduction_of(model))
    optimizer = instantiate_node(form_node(cfg.mechanism, model), _convert_="all")(params=model.parameters(), context=context)
    if prepare:
        optimizer.prepare(model)
    # Poisson sampling is part of the privacy proof (amplification): secret unless noise_seed is explicit
    sampler_seed = cfg.get("noise_seed") if mech_cls.private else int(cfg.seed)
    sampler = PoissonBatchSampler(train, model.item_means if model.centres_on_item_means else train.item_means(),
                                  ratio, unit, noise_generator(sampler_seed, device, SAMPLER_STREAM),
                                  history=bool(model.reads_history), masked=masked_steps(model, device))
    return TrainingSetup(fold, model, sampler, optimizer, epochs, rule)


References = Callable[[Fold, dict[str, Any]], dict[str, dict[str, float]]]


def train_fold(cfg: DictConfig, fold: Fold, out: Path, device: torch.device, references: References | None = None) -> dict[str, Any]:
    """Train a model under ``cfg.mechanism`` on one fold; returns its fold record. ``references(fold, report)``
    scores the non-private references on the fold as loaded (before the tau cap), for the record and hparams."""
    if selects_privately(cfg):
        return train_selected(cfg, fold, out, device, references)
    loaded = fold
    path = out / f"checkpoint_fold{fold.index}.pt"
    resuming = bool(cfg.resume) and path.exists()
    if cfg.resume and not resuming:  # a finished private fold whose secret checkpoint was deleted: never release again
        check_nothing_released(out, fold.index)
    setup = setup_training(cfg, fold, device, prepare=not resuming)
    fold, model, sampler, optimizer, epochs = setup.fold, setup.model, setup.sampler, setup.optimizer, setup.epochs
    train = fold.train
    restored = None
    if resuming:  # restores what prepare() made (r_bar, the fallback, S, the release record, the accountant) first
        ckpt = load_checkpoint(path, model=model, optimizer=optimizer, sampler_generator=sampler.generator, config=resolved_config(cfg))
        restored = {k: ckpt[k] for k in ("epoch", "history", "extra", "rng")}  # the Trainer's part, not the tensors
        del ckpt
    report = optimizer.report()
    check_scale_declared(train, report)  # a finite epsilon needs data.rating_scale on custom data
    check_claim(optimizer, report)  # no finite epsilon without a sensitivity harness (privacy_harness/registry.py)
    log.info("mechanism %s | relation %s | %s", report["mechanism"], report.get("relation"), report["analysis"])
    writer = None
    if cfg.get("tensorboard", True):
        writer = summary_writer_class()(log_dir=str((out / "tb" / f"fold{fold.index}").absolute()))  # closed later, maybe after a chdir
    diagnostics = diagnostics_enabled(cfg.get("log_private_diagnostics"), report)
    trainer = Trainer(model, optimizer, sampler, epochs, path, writer, bool(cfg.resume), config=resolved_config(cfg),
                      private_diagnostics=diagnostics, checkpoint_every=cfg.get("checkpoint_every", "auto"))
    last_summaries: Callable[[Any], None] | None = None
    try:
        result = trainer.fit(fold, restored)
        metrics = score_predictor(model, fold)  # overlaps the last checkpoint's write
        report = optimizer.report()
        if setup.rule is not None:
            report["size_rule"] = setup.rule
        report["scope"] = privacy_scope(report, model, diagnostics, item_universe_of(train))
        report.update(noise_randomness(cfg, report, trainable=True))
        report["release"] = write_trained_fold_release(cfg, out, fold, model, report, result.epochs)  # what may be published: no key, no generator state
        refs = references(loaded, report) if references is not None else None
        if writer is not None:
            hparams = {f"mechanism.{k}": v for k, v in OmegaConf.to_container(cfg.mechanism, resolve=True).items()
                       if isinstance(v, (int, float, str, bool)) and not k.startswith("_")}
            hparams["epsilon"] = float(cfg.epsilon)
            # TensorBoard keeps only the first hparams summary of a run: the references go in the same one
            hp_metrics = {"hparam/test_rmse": metrics["rmse"], "hparam/test_mae": metrics["mae"], **reference_hparams(refs or {})}

            def last_summaries(writer: Any) -> None:  # run by the thread that closes the writer (tb_close.close_in_background)
                log_references(writer, refs or {})  # the references' scalars beside the model's, in the fold's one writer
                writer.add_hparams(hparams, hp_metrics, run_name="hparams")  # opens and closes a writer of its own
    finally:
        if writer is not None:
            from dprec_torch.training.tb_close import close_in_background

            close_in_background(writer, last_summaries)  # off the critical path; joined before the process exits
        trainer.finish()  # the fold's checkpoint is on disk before its record (and metrics.json) exist
    return {"fold": fold.index, **{f"test_{k}": v for k, v in metrics.items()}, "fit_seconds": result.train_seconds,
            "epochs": result.epochs, "seconds_per_epoch": result.train_seconds / max(result.epochs, 1),
            "epoch_seconds": result.epoch_seconds, "history": result.history, "privacy": report, "diagnostics": diagnostics,
            **({"references": refs} if refs is not None else {})}


def train_candidate(cfg: DictConfig, fold: Fold, device: torch.device) -> tuple[dict[str, Any], Any]:
    """Train one round's candidate on ``fold`` as ``train_fold`` does, writing nothing (no checkpoint, release or
    TensorBoard): ``(record, model)``."""
    setup = setup_training(cfg, fold, device)
    check_claim(setup.optimizer, setup.optimizer.report())  # no finite epsilon without a sensitivity harness
    trainer = Trainer(setup.model, setup.optimizer, setup.sampler, setup.epochs, None, None, False,
                      config=resolved_config(cfg), private_diagnostics=False, checkpoint_every="end")
    try:
        result = trainer.fit(setup.fold, None)
    finally:
        trainer.finish()
    report = setup.optimizer.report()
    if setup.rule is not None:
        report["size_rule"] = setup.rule
    return {"privacy": report, "epochs": result.epochs, "fit_seconds": result.train_seconds, "epoch_seconds": result.epoch_seconds}, setup.model


def train_selected(cfg: DictConfig, fold: Fold, out: Path, device: torch.device, references: References | None = None) -> dict[str, Any]:
    """``train_fold`` under ``mechanism.select=private``: select (:mod:`dprec_torch.training.private_selection`), then
    score the chosen model on the fold's test split once and write its release."""
    chosen = select_fold(cfg, fold, device, lambda c, f: train_candidate(c, f, device))
    model, record = chosen["model"], chosen["record"]
    metrics = score_predictor(model, fold)
    report = record["privacy"]
    report["scope"] = privacy_scope(report, model, False, item_universe_of(chosen["fold"].train))
    report.update(noise_randomness(cfg, report, trainable=True))
    report["release"] = write_trained_fold_release(cfg, out, fold, model, report, record["epochs"])
    refs = references(fold, report) if references is not None else None
    return {"fold": fold.index, **{f"test_{k}": v for k, v in metrics.items()}, "fit_seconds": record["fit_seconds"],
            "epochs": record["epochs"], "seconds_per_epoch": record["fit_seconds"] / max(record["epochs"], 1),
            "epoch_seconds": record["epoch_seconds"], "history": [], "privacy": report, "diagnostics": False,
            **({"references": refs} if refs is not None else {})}


def write_trained_fold_release(cfg: DictConfig, out: Path, fold: Fold, model: torch.nn.Module, report: dict[str, Any],
                               epochs: int) -> dict[str, Any]:
    """Write the trained ``model``'s release for ``fold`` to ``out/release_fold<k>.pt`` (atomic; the model's state, a copy
    of the privacy report, metadata; never the checkpoint's generator/optimizer state) and return the report's
    ``release`` entry (:func:`dprec_torch.predictors.release.write_trained_release`)."""
    from dprec_torch.predictors.release import release_path, write_trained_release

    model_config = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "seed"}
    meta = {"model": cfg.model.get("name"), "mechanism": cfg.mechanism.get("name"), "fold": int(fold.index),
            "fold_name": fold.name, "n_users": int(fold.train.n_users), "n_items": int(fold.train.n_items),
            "epochs": int(epochs), "model_config": model_config}
    path = release_path(out, fold.index)
    entry = write_trained_release(path, model, report, meta)
    log.info("fold %s: release written to %s (%s)", fold.index, path,
             "covered by epsilon" if entry["covered_by_epsilon"] else "not covered by epsilon")
    return entry


def build_predictor(cfg: DictConfig) -> Any:
    """The fitted predictor of ``cfg.model``, wrapped by ``cfg.mechanism`` when that is an output mechanism
    (``fit_fold`` and :func:`dprec_torch.training.evaluate.restore_predictor` build it the same way)."""
    predictor = instantiate_node(cfg.model)
    if wrapped_by_mechanism(cfg):
        predictor = instantiate_node(cfg.mechanism).wrap(predictor)
    return predictor


def wrapped_by_mechanism(cfg: DictConfig) -> bool:
    """Whether ``cfg.mechanism`` wraps the fitted predictor, asked of its class: an :class:`OutputMechanism`
    (``laplace_output``, ``exponential_topk``) wraps it; a :class:`LeavesPredictorAsFitted` (``none``: no mechanism;
    ``builtin``: the predictor's own) leaves it as fitted; a training mechanism is refused in one line."""
    cls = mechanism_class(cfg)
    if issubclass(cls, LeavesPredictorAsFitted):
        return False
    if issubclass(cls, OutputMechanism):
        return True
    raise ConfigError(f"mechanism={cfg.mechanism.get('name', cfg.mechanism._target_)} trains nn.Module models (pnbm, mf); "
                      f"model={cfg.model.get('name', '?')} is a fitted predictor: use mechanism=none or an output mechanism")


def fit_fold(cfg: DictConfig, fold: Fold, device: torch.device) -> dict[str, Any]:
    """Fit a predictor (optionally wrapped by an output mechanism) on one fold; writes its release
    (``release_fold<k>.pt``, :func:`write_fold_release`) into the run dir."""
    check_fold_units(cfg, fold)  # delta < 1/(privacy units) before anything is released
    predictor = build_predictor(cfg)
    t0 = time.perf_counter()
    predictor.fit(fold.train)
    fit_s = time.perf_counter() - t0
    if isinstance(predictor, ReportsPrivacy):
        claim = predictor.privacy_report()
        check_scale_declared(fold.train, claim)
        check_claim(predictor, claim)  # no finite epsilon without a sensitivity harness, before anything is scored
    metrics = score_predictor(predictor, fold, int(cfg.eval.topn), float(cfg.eval.relevance_threshold))
    report = predictor.privacy_report() if isinstance(predictor, ReportsPrivacy) else {"mechanism": "none"}
    diagnostics = diagnostics_enabled(cfg.get("log_private_diagnostics"), report)
    report = {**report, "scope": privacy_scope(report, None, diagnostics, item_universe_of(fold.train)), **noise_randomness(cfg, report, trainable=False)}
    from hydra.core.hydra_config import HydraConfig

    if cfg.get("output_dir") or HydraConfig.initialized():  # no release outside a run (fit_fold called on its own)
        report["release"] = write_fold_release(cfg, output_dir(cfg), fold, predictor, report)
    return {"fold": fold.index, **{f"test_{k}": v for k, v in metrics.items()}, "fit_seconds": fit_s,
            "privacy": report, "diagnostics": diagnostics}


def write_fold_release(cfg: DictConfig, out: Path, fold: Fold, predictor: Any, report: dict[str, Any]) -> dict[str, Any]:
    """Write ``predictor``'s release for ``fold`` to ``out/release_fold<k>.pt`` (atomic; a copy of the privacy report
    inside) and return the report's ``release`` entry: the file, whether epsilon covers it, where the user side comes from.

    Covered: a finite epsilon of the predictor itself (its release is the item side it learned). Not covered: a
    non-private fit, PNCF (no end-to-end claim) and an output mechanism's model (epsilon covers the noised answers)."""
    from dprec_torch.predictors.release import ReleasesState, release_path, write_release

    if not isinstance(predictor, ReleasesState):
        raise ConfigError(f"model={cfg.model.get('name', '?')} cannot write its release (no released_state/restore); "
                          "see dprec_torch/predictors/release.py")
    path = release_path(out, fold.index)
    eps = report.get("epsilon")
    covered = eps is not None and bool(np.isfinite(float(eps))) and not wrapped_by_mechanism(cfg)
    if covered:
        what = "the release epsilon covers (item side only): publishing it costs no further privacy"
    elif wrapped_by_mechanism(cfg):
        what = (f"the curator's fitted state: mechanism={cfg.mechanism.get('name')}'s epsilon covers the noised answers, not "
                "this file; keep it as private as the training data")
    else:
        what = "fitted state that no finite epsilon covers: keep it as private as the training data"
    entry = {"file": path.name, "covered_by_epsilon": covered, "what": what,
             "user_side": ("not in the file: load_run and evaluate.py run= recompute each user's part (offsets, factors, "
                           "history) from that user's own ratings in the run's training split and the released item side")}
    copy = json.loads(json.dumps({**report, "release": entry}, default=str))  # plain values only (weights_only loading)
    meta = {"model": cfg.model.get("name"), "mechanism": cfg.mechanism.get("name"), "fold": int(fold.index),
            "fold_name": fold.name, "n_users": int(fold.train.n_users), "n_items": int(fold.train.n_items), "privacy": copy}
    write_release(path, predictor, meta)
    log.info("fold %s: release written to %s (%s)", fold.index, path, "covered by epsilon" if covered else "not covered by epsilon")
    return entry


def noise_randomness(cfg: DictConfig, report: dict[str, Any], trainable: bool) -> dict[str, Any]:
    """``{"randomness": ...}`` for a report with a finite epsilon: the noise is secret only when every node that draws it
    (the mechanism, or a private predictor and its output mechanism) and, for trained models, the Poisson sampler got
    no explicit seed."""
    eps = report.get("epsilon")
    if eps is not None and not np.isfinite(float(eps)):  # non-private: nothing to keep secret
        return {}
    nodes = [cfg.mechanism] if trainable else [cfg.model, *([cfg.mechanism] if wrapped_by_mechanism(cfg) else [])]
    seeds = [n.get("seed") for n in nodes if n.get("_target_") and "seed" in n]
    secret = all(s is None for s in seeds) and (not trainable or cfg.get("noise_seed") is None)
    return {"randomness": randomness_report(secret)}


#: config keys that change nothing a run releases (where it runs, what it logs, when it checkpoints; the fold is a key
#: label of its own): left out of :func:`job_label`, so such a change redraws the same noise under one noise_seed
NOT_RELEASE_KEYS = ("hydra", "output_dir", "resume", "keep_checkpoint", "checkpoint_every", "tensorboard", "device",
                    "log_private_diagnostics", "compare_baselines", "noise_seed")


#: mechanism keys a form's composed configs carried, at these values, before the form became its own class (no class
#: reads them now): :func:`job_label` digests them so, and a ``noise_seed`` rerun of a job from then draws the same noise
DIGESTED_AS_BEFORE: dict[str, dict[str, Any]] = {
    "dprec_torch.mechanisms.clipped_sgld.ClippedSGLD": {"decay": 0.0, "prior_kappa": None, "prior_mean": 0.0},
    "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD": {"accountant": "rdp", "delta": "${delta}"},
}


def job_label(cfg: DictConfig) -> str:
    """A digest of everything that shapes a job's releases (the resolved config but :data:`NOT_RELEASE_KEYS` and
    ``data.fold``): the job label of its noise keys. Two jobs of a sweep that differ in anything they release (epsilon,
    lr, ...) draw independent noise under one ``noise_seed``; the same job run twice draws the same (one release),
    also across the split of a form into its own class (:data:`DIGESTED_AS_BEFORE`)."""
    import hashlib

    conf = {k: v for k, v in resolved_config(cfg).items() if k not in NOT_RELEASE_KEYS}
    if isinstance(conf.get("data"), dict):
        conf["data"] = {k: v for k, v in conf["data"].items() if k != "fold"}
    mechanism, target = conf.get("mechanism"), OmegaConf.select(cfg, "mechanism._target_")
    form = target and forms.form_path(target, forms.model_target(cfg.get("model")))
    if isinstance(mechanism, dict) and mechanism.get("select", "none") == "none":  # unused selection keys release nothing
        mechanism = conf["mechanism"] = {k: v for k, v in mechanism.items() if k not in SELECT_KEYS}
    if isinstance(mechanism, dict) and form in DIGESTED_AS_BEFORE:
        before = {k: conf.get("delta") if v == "${delta}" else v for k, v in DIGESTED_AS_BEFORE[form].items()}
        conf["mechanism"] = {**mechanism, **before}
    return hashlib.sha256(json.dumps(conf, sort_keys=True, default=str).encode()).hexdigest()[:32]


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain containers (what ``config_resolved.json`` and each checkpoint record)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def summarise(cfg: DictConfig, dataset: RatingDataset, folds: list[dict[str, Any]], baselines: list[dict] | None) -> dict[str, Any]:
    keys = [k for k in folds[0] if k.startswith("test_")]
    metrics: dict[str, Any] = {"model": cfg.model.get("name", cfg.model.get("_target_")), "mechanism": cfg.mechanism.get("name"),
                               "data": dataset.name, "dataset": dataset.record(), "epsilon": float(cfg.epsilon), "seed": int(cfg.seed),
                               "matmul_precision": torch.get_float32_matmul_precision()}
    for k in keys:
        vals = [f[k] for f in folds]
        metrics[k] = float(np.mean(vals))
        metrics[k + "_std"] = float(np.std(vals))
    # each fold released its own model, all on the same people: privacy.epsilon is their joint figure (run_privacy)
    metrics["folds"] = [{**{k: v for k, v in f.items() if k not in ("history", "privacy", "diagnostics")},
                         "privacy_epsilon": f["privacy"].get("epsilon"), "privacy_delta": f["privacy"].get("delta")}
                        for f in folds]
    if "epochs" in folds[0]:
        metrics["epochs"] = folds[0]["epochs"]
        metrics["train_seconds"] = float(sum(f["fit_seconds"] for f in folds))
        metrics["seconds_per_epoch"] = float(np.mean([f["seconds_per_epoch"] for f in folds]))
        # steady state: the first epoch of a process also pays one-off warm-up (kernel loading, caches)
        later = [t for f in folds for t in f["epoch_seconds"][1:]]
        metrics["seconds_per_epoch_after_first"] = float(np.mean(later)) if later else None
        metrics["history"] = {f["fold"]: f["history"] for f in folds}
    # where the hyperparameters came from, and whether that source shares people with this data
    from dprec_torch.privacy.ledger import run_privacy

    metrics["privacy"] = {**run_privacy([f["privacy"] for f in folds], [f["fold"] for f in folds]),
                          "hyperparameters": hyperparameter_provenance(cfg)}
    if baselines:
        metrics["baselines"] = {name: {m: float(np.mean([b[name][m] for b in baselines])) for m in baselines[0][name]}
                                for name in baselines[0]}
    return metrics


def sweep_lock_dir() -> Path | None:
    """Where the jobs of a Hydra multirun coordinate their GPUs (None outside a multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir) / ".gpu-locks"


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run the configured experiment; writes ``metrics.json`` and returns its contents."""
    validate(cfg)
    diagnostics_enabled(cfg.get("log_private_diagnostics"), {})  # a bad value fails before any data is read
    if cfg.get("noise_seed") is None and not np.isfinite(float(cfg.epsilon)):
        with open_dict(cfg):  # nothing to keep secret: a non-private run stays reproducible from `seed`
            cfg.noise_seed = int(cfg.seed)
    seed_everything(int(cfg.seed))
    set_matmul_precision(cfg.get("matmul_precision", "highest"))
    with claimed_device(cfg.device, sweep_lock_dir()) as device:
        return run_experiment(cfg, device)


def run_experiment(cfg: DictConfig, device: torch.device) -> dict[str, Any]:
    """Train (or fit) on every fold of ``cfg.data`` on ``device``; writes ``metrics.json``."""
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    prepare_run_dir(out, resolved_config(cfg))  # a resume is checked against the recorded config BEFORE it is rewritten
    # shared(...) is build() itself outside hydra/launcher=batched (dprec_torch/sweep_cache.py)
    dataset = shared("dataset", cfg.data, lambda: instantiate_node(cfg.data))
    trainable = is_trainable(cfg.model)
    folds, baselines, info = [], [], {}
    k = int(cfg.baseline_k)

    def references(fold: Fold, report: dict[str, Any]) -> dict[str, dict[str, float]]:
        target = dp_reference_target(report, cfg.epsilon)
        return {**shared("baselines", cfg.data, lambda: baseline_metrics(fold, k), fold.index, device, k),
                **dp_reference_metrics(fold, target, cfg.get("noise_seed"))}  # not shared: it depends on epsilon

    job = job_label(cfg)
    for fold in dataset.folds:
        fold = shared("fold", cfg.data, lambda: fold.to(device), fold.index, device)
        log.info("fold %s (%s): train %s | test %d ratings", fold.index, fold.name, fold.train.describe(), len(fold.test))
        with key_scope(job=job, fold=fold.index):  # every fold and job its own keys, under one noise_seed too
            record = (train_fold(cfg, fold, out, device, references if cfg.compare_baselines else None) if trainable
                      else fit_fold(cfg, fold, device))
        folds.append(record)
        # the references are test metrics like the model's own: every run has them (compare_baselines), whatever
        # log_private_diagnostics says (it governs what is computed from the training data for the private model)
        if cfg.compare_baselines and "test_rmse" in record:
            target = dp_reference_target(record["privacy"], cfg.epsilon)
            with key_scope(job=job, fold=fold.index):
                refs = record.pop("references", None) or references(fold, record["privacy"])
            baselines.append(refs)
            info = reference_info(k, target)
            scope = record["privacy"].get("scope")
            if scope is not None:
                scope["not_covered"] = [*scope["not_covered"], *reference_scope(info)]
    metrics = summarise(cfg, dataset, folds, baselines)
    log.info("hyperparameters: %s", metrics["privacy"]["hyperparameters"].get("statement", ""))
    if baselines:
        metrics["baseline_info"] = info
    atomic_write_json(out / "metrics.json", metrics)
    if trainable:  # metrics.json and every release are on disk: the secret checkpoints go (keep_checkpoint, resume)
        discard_secret_checkpoints(out, folds, resume=bool(cfg.get("resume")), keep=bool(cfg.get("keep_checkpoint")))
    return metrics


def comparison_table(metrics: dict[str, Any]) -> str:
    """The final table the CLI prints (and ``Run.table()``): this run next to its references on the same folds
    and k -- non-private PCC and COS, and DP item means + user offset at the run's epsilon where it has one --,
    each labelled with what it is (``metrics.json["baseline_info"]``)."""
    eps = metrics["privacy"].get("epsilon")
    rows = [(f"{metrics['model']} ({metrics['mechanism']})", metrics.get("test_rmse"), metrics.get("test_mae"))]
    for name, m in metrics.get("baselines", {}).items():
        rows.append((reference_label(name, metrics.get("baseline_info")), m.get("rmse"), m.get("mae")))
    width = max(28, *(len(n) for n, _, _ in rows))
    lines = [f"{'method':<{width}} {'RMSE':>8} {'MAE':>8}"]
    lines += [f"{n:<{width}} {r:>8.4f} {a:>8.4f}" for n, r, a in rows if r is not None]
    if not metrics.get("baselines") and metrics.get("test_rmse") is not None:
        lines.append("(no reference baselines: compare_baselines=false)")
    if topn := {k: v for k, v in metrics.items() if k.startswith("test_") and "@" in k and not k.endswith("_std")}:
        lines.append("top-N: " + ", ".join(f"{k[5:]} {v:.4f}" for k, v in topn.items()))
    joint = metrics["privacy"].get("joint")
    if isinstance(joint, dict):  # several fold models of the same people: the joint figure, then one model's
        one = metrics["privacy"].get("epsilon_per_model")
        delta = metrics["privacy"].get("delta")
        eps_text = ("not established" if eps is None else f"{eps:.6g}" + ("" if not delta else f" (delta={delta:g})")
                    + f" joint over the {joint['models']} fold models (same people; each alone: "
                    + ("not established" if one is None else f"{one:.6g}") + ")")
    else:
        eps_text = "not established" if eps is None else eps
    lines.append(f"privacy: {metrics['privacy'].get('mechanism')} | relation={metrics['privacy'].get('relation')} | "
                 f"epsilon={eps_text}")
    return "\n".join(lines)
