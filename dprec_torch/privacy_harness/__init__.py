"""The sensitivity harness: every privacy claim checked against the real mechanisms.

It sits ABOVE ``mechanisms/``, ``models/`` and ``predictors/`` (its cases build them) and below ``training/`` (the
runner's :func:`~dprec_torch.privacy_harness.registry.check_claim`), so that ``privacy/`` can stay pure privacy math
(accountants, budgets, sensitivity formulas, scope) that the mechanisms import from below.

* :mod:`.case`: what a case is (``SensitivityCase``, ``Release``), imported by every case module;
* :mod:`.registry`: collects the case modules' tables, ``check_claim`` (no finite epsilon without a case);
* :mod:`.sensitivity_cases`: the built-in mechanisms' cases;
* :mod:`.learned_similarity_cases`: the noisy Gram and DP-ALS cases;
* :mod:`.lowrank_pnbm_cases`: the low-rank PNBM's mechanisms (added to the full form's cases);
* :mod:`.split_cases`: the neighbour is the input FILE minus one user, its id map and split rebuilt:
  other users' ratings stay put, and the user-level cases' bounds hold on the train sets drawn from the two.

Imports run one way: registry -> case modules -> case (no case module imports the registry).
"""
