"""Which class trains a model under a mechanism: ONE table (after Opacus's ``get_optimizer_class``).

A ``conf/mechanism/X.yaml`` names its key's class; where that key trains a model family by another class, :data:`FORMS`
says so, keyed by (the key's class, the model's family). The runner (``training.run.setup_training``), the config check
(``config.check_config``: the form's signature is the one read) and the privacy rules (``privacy.relations.form_target``)
all ask it. Dotted class paths: this module imports no package unit, every layer may read it. The one model alias,
``model=pnbm model.similarity=lowrank`` (= ``model=pnbm_lowrank``), is here too (``config.resolve_model_node``).
"""

from __future__ import annotations

from typing import Any

from hydra.utils import get_class

#: model class -> family (the yaml names of conf/model/)
MODEL_FAMILIES: dict[str, str] = {
    "dprec_torch.models.pnbm.PNBM": "pnbm",
    "dprec_torch.models.pnbm_lowrank.LowRankPNBM": "pnbm_lowrank",
    "dprec_torch.models.pnbm_topk.PNBMTopK": "pnbm_topk",
    "dprec_torch.models.mf.MF": "mf",
}

_M = "dprec_torch.mechanisms."
#: (a mechanism key's class, model family) -> the class that trains that family under the key (other pairs: the key's own)
FORMS: dict[tuple[str, str], str] = {
    (_M + "gaussian.GaussianDPSGD", "pnbm"): _M + "gaussian.GaussianPNBM",
    (_M + "gaussian.GaussianDPSGD", "pnbm_lowrank"): _M + "gaussian.GaussianPNBM",
    (_M + "sgld.ScaledPosteriorSGLD", "pnbm_lowrank"): _M + "clipped_sgld.ClippedSGLD",
    (_M + "dpsgd_paper.DPSGDLaplace", "mf"): _M + "dpsgd_mf.DPSGDMF",
}

#: ``model.similarity`` of a PNBM node -> the class it names (the documented alias model=pnbm model.similarity=lowrank)
SIMILARITY_FORMS: dict[str, str] = {"full": "dprec_torch.models.pnbm.PNBM",
                                    "lowrank": "dprec_torch.models.pnbm_lowrank.LowRankPNBM"}


def path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def form_path(default: str, model: Any) -> str:
    """The dotted class that trains ``model`` (instance, class or dotted path; None: unknown) under the key whose
    class is ``default``. A model's family is the first class in its MRO that :data:`MODEL_FAMILIES` names."""
    cls = get_class(model) if isinstance(model, str) else model if isinstance(model, type) else type(model)
    family = next((MODEL_FAMILIES[p] for p in map(path_of, cls.__mro__) if p in MODEL_FAMILIES), None)
    return FORMS.get((default, family), default)


def mechanism_class(default_cls: type, model: Any) -> type:
    """The class that trains ``model`` under the key whose class is ``default_cls`` (:data:`FORMS`)."""
    path = form_path(path_of(default_cls), model)
    return default_cls if path == path_of(default_cls) else get_class(path)


def model_target(node: Any) -> str | None:
    """The class a model node names: its ``_target_``, or for a PNBM node the class its ``similarity`` picks."""
    target = node.get("_target_") if node is not None else None
    alias = target == SIMILARITY_FORMS["full"] and "similarity" in node
    return SIMILARITY_FORMS.get(node.similarity, target) if alias else target
