"""The sensitivity harness: every privacy claim checked against the real mechanisms.

It sits ABOVE ``mechanisms/``, ``models/`` and ``predictors/`` (its cases build them) and below
``training/`` (the runner's :func:`~dprec_torch.privacy_harness.registry.check_claim`), so that
``privacy/`` can stay pure privacy math (accountants, budgets, sensitivity formulas, scope) that
the mechanisms import from below.

* :mod:`.registry`: ``register_sensitivity`` / ``check_claim`` (no finite epsilon without a case);
* :mod:`.sensitivity_cases`: the built-in mechanisms' cases;
* :mod:`.learned_similarity_cases`: the issue-17 noisy Gram and DP-ALS cases.
"""
