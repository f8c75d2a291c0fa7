"""dprec-torch: differentially private learned-similarity recommenders in PyTorch.

The Python API (docs/python_api.md), loaded on first use so that ``import dprec_torch`` stays cheap
(no torch or Hydra import until one of these names is touched):

* ``dprec_torch.train(overrides) -> Run``: train as ``python train.py <overrides>`` does;
* ``dprec_torch.load_run(dir) -> Run``: a finished run with its released models restored (never re-fitted);
* ``Run.metrics``, ``Run.privacy``, ``Run.predict(users, items)``, ``Run.recommend(user, n)`` (raw ids).
"""

import warnings

# torch flags every CSR op as "beta"; we rely on the stable subset (spmm, csr construction).
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")

__version__ = "0.1.0"
__all__ = ["Run", "load_run", "train", "__version__"]

_API = ("Run", "load_run", "train", "compose_config")


def __getattr__(name: str):
    """Lazy exports (PEP 562): ``dprec_torch.train`` imports :mod:`dprec_torch.api` on first access."""
    if name in _API:
        from dprec_torch import api

        return getattr(api, name)
    raise AttributeError(f"module 'dprec_torch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
