"""Privacy maths, reports and the ledger. Importing it registers the ``${preset:KEY}`` resolver of the presets
(:mod:`dprec_torch.privacy.provenance`), so a preset composes wherever a model is built."""

from dprec_torch.privacy import provenance as provenance  # noqa: F401 - registers the resolver
