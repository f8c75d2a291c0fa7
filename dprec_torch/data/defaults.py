"""Config defaults that depend on the dataset: the paper's k of the PCC/COS baselines."""

from __future__ import annotations

from omegaconf import DictConfig

#: k of the non-private PCC/COS baselines per dataset (Wang & Tang Sec. 5.1); any other dataset: 900.
PAPER_KNN_K = {"ml-100k": 900, "ml-1m": 1300}


def dataset_name(cfg: DictConfig) -> str:
    """The MovieLens name behind ``cfg.data`` (through a validation wrapper), else its ``name``."""
    data = cfg.data
    inner = data.get("dataset")
    return str((inner if isinstance(inner, DictConfig) else data).get("name", ""))


def paper_knn_k(name: str) -> int:
    """900 on ML-100K, 1300 on ML-1M (the paper's PCC/COS k), 900 elsewhere."""
    return PAPER_KNN_K.get(name, PAPER_KNN_K["ml-100k"])


def fill_dataset_defaults(cfg: DictConfig) -> None:
    """``baseline_k: null`` and ``model.k: null`` of PCC/COS become the paper's k for the dataset, in place,
    so ``config_resolved.json`` records the k that was used."""
    k = paper_knn_k(dataset_name(cfg))
    if "baseline_k" in cfg and cfg.baseline_k is None:
        cfg.baseline_k = k
    if cfg.model.get("_target_") == "dprec_torch.predictors.knn.ItemKNN" and cfg.model.get("k", 0) is None:
        cfg.model.k = k
