"""dprec-torch: differentially private learned-similarity recommenders in PyTorch."""

import warnings

# torch flags every CSR op as "beta"; we rely on the stable subset (spmm, csr construction).
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")

__version__ = "0.1.0"
