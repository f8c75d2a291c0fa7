"""Privacy ledger: what a whole sweep spent on the same people, and whether it tuned on the test split.

Every run writes ``metrics.json`` with ``privacy`` (its mechanism's report: ``epsilon``, ``delta``, ``relation``). The
ledger charges every released model to its dataset, the POPULATION it trained on: ML-100K's five folds (ML-1M's
repeated hold-outs, a fold's validation split) all train on the same 943 (6,040) people, so their epsilons compose, by
basic composition, to (sum eps_k, sum delta_k)-DP. Choosing the best run by its validation RMSE is NOT post-processing
(the score reads those people's validation ratings): the SUM (never the chosen run's eps) bounds the releases only, not
the choice, and gives no end-to-end epsilon (choose on other people's data, or privately:
:mod:`dprec_torch.privacy.provenance`).

What one run charges (:func:`charged_epsilon`):

* a ``fold=all`` run released five models: it charges once their joint epsilon ``privacy.joint`` (:func:`run_privacy`,
  composed by the mechanism's own accountant); a record written before that field charges the sum over its folds of
  each fold record's ``privacy_epsilon`` where written, else of the run's ``privacy.epsilon``;
* a per-query report (``laplace_output``, Park & Acharya: the epsilon of one released value) charges its basic
  composition over all ``released_values`` (they all read the same ratings: parallel composition does not apply); a
  report headlining the composed total (``epsilon_scope`` "total ...") is charged as it is.

Units: a user-level eps_k is 2 eps_k at rating level (a changed rating is a changed profile); a rating-level guarantee
gives nothing at user level, any other relation (e.g. one entry of a score matrix) nothing about the training data. An
epsilon ``None`` (not established) or ``inf`` makes the total ``inf``. A finite epsilon with ``delta`` ``None`` or
absent (e.g. SGLD's chain: nobody bounds its distance from the posterior) has an UNESTABLISHED delta, never 0: the
run's delta is NaN, its totals (inf, NaN), printed "not established".

Validation runs (data name ending in ``+validation``, :mod:`dprec_torch.data.validation`) train on a subset of the same
people: the same ledger entry. Several runs of one cell (mechanism, model, nominal epsilon, folds) scored on the TEST
split of one dataset trigger a warning: picking among them by ``test_rmse`` tunes on the test set.

Tuning cost (``tuning`` per entry; ``scripts/study.py``'s two-stage study): the validation runs of one (mechanism,
model, nominal epsilon) are the configurations tried for that cell; their releases cost sum_k eps_k (= n x eps when
all equal; basic composition on the same people) at the mechanism's relation, before the final runs' own eps. The
choice among them reads the validation ratings and is not in that sum (the statement says so). Mechanisms whose
epsilon is null (``dpsgd_paper``, ``sgld_paper`` on PNBM) defend nothing, for tuning or otherwise.

When every run of a dataset carries an accountant history under one Opacus accountant, delta and relation (the
Gaussian mechanisms), the entry's ``composed`` is their composition by that accountant (tighter than the basic sum,
which stays in the table's columns). ``python scripts/ledger.py SWEEP_DIR`` prints the table; :func:`ledger_report`
returns it as a dict.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dprec_torch.data.validation import VALIDATION_SUFFIX


@dataclass
class LedgerRun:
    """One ``metrics.json``: ``epsilon`` is what the run charges (all its models, all its releases)."""

    path: str
    data: str
    folds: tuple[int, ...]
    mechanism: str
    relation: str | None
    epsilon: float
    delta: float
    validation: bool
    test_rmse: float | None
    model: str = "?"
    epsilon_nominal: float | None = None
    models: int = 1
    epsilon_per_model: float = math.nan
    #: the run's accountant record for a tighter composition with the other runs on the same people (:func:`_history`)
    accounting: dict[str, Any] | None = None


@dataclass
class LedgerEntry:
    """All runs on one dataset: the same people, whatever the fold."""

    data: str
    runs: list[LedgerRun] = field(default_factory=list)

    @property
    def folds(self) -> tuple[int, ...]:
        return tuple(sorted({f for r in self.runs for f in r.folds}))

    def total(self, relation: str) -> tuple[float, float]:
        """(sum eps, sum delta) at ``relation`` level (user or rating) by basic composition."""
        eps, delta = 0.0, sum(r.delta for r in self.runs)
        if math.isnan(delta):  # a delta nobody established: no (eps, delta) pair is defended
            return math.inf, math.nan
        for r in self.runs:
            if not math.isfinite(r.epsilon) or r.relation is None:
                return math.inf, delta
            if r.relation == relation:
                eps += r.epsilon
            elif r.relation == "user" and relation == "rating":
                eps += 2 * r.epsilon
            else:
                return math.inf, delta
        return eps, delta

    def composed(self) -> dict[str, Any] | None:
        """All the runs' releases composed by their own accountant (module docstring; :func:`joint_epsilon` of the
        concatenated histories); None otherwise (:meth:`total` is then the figure)."""
        records = [r.accounting for r in self.runs]
        if len(records) < 2 or any(a is None for a in records) or len({r.relation for r in self.runs}) != 1:
            return None
        joint = joint_epsilon(records, what="jobs")  # type: ignore[arg-type]
        if "accountant_history" not in joint:
            return None
        return {"epsilon": joint["epsilon"], "delta": joint["delta"], "relation": self.runs[0].relation, "method": joint["method"]}

    @property
    def test_runs(self) -> list[LedgerRun]:
        return [r for r in self.runs if not r.validation]

    def tuning(self) -> list[dict[str, Any]]:
        """Per (mechanism, model, nominal eps): the validation runs tried and their summed epsilon (basic composition)."""
        cells: dict[tuple[str, str, float | None], list[LedgerRun]] = {}
        for r in self.runs:
            if r.validation:
                cells.setdefault((r.mechanism, r.model, r.epsilon_nominal), []).append(r)
        out = []
        for (mech, model, eps_nom), runs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0.0)):
            eps = [r.epsilon for r in runs]
            rel = runs[0].relation
            folds = ",".join(map(str, sorted({f for r in runs for f in r.folds})))
            if all(math.isfinite(e) for e in eps) and all(r.relation == rel for r in runs):
                total = float(sum(eps))
                how = (f"{len(runs)} x {eps[0]:.4g}" if len(set(eps)) == 1 else f"sum over {len(runs)} configs")
                statement = (f"{how} = {total:.4g} ({rel} level, basic composition, on the people of {self.data}; "
                             f"tuned on the train side of fold {folds}); the choice by validation RMSE reads these "
                             "people's validation ratings and is not post-processing: not counted in this sum")
            else:
                total = math.inf
                statement = f"none defended: the {len(runs)} configs tried have epsilon null (nothing is defended)"
            out.append({"method": f"{mech}-{model}", "mechanism": mech, "model": model, "epsilon_nominal": eps_nom,
                        "configs": len(runs), "relation": rel, "epsilon_tuning": total, "statement": statement})
        return out

    def warnings(self) -> list[str]:
        out = []
        cells = Counter((r.mechanism, r.model, r.epsilon_nominal, r.folds) for r in self.test_runs)
        if any(n > 1 for n in cells.values()):
            out.append(f"{len(self.test_runs)} runs on {self.data} were scored on the TEST split, "
                       f"up to {max(cells.values())} of them for the same (mechanism, model, epsilon, folds): "
                       "choosing hyperparameters by their test metrics tunes on the test set; tune with data=<name>-val "
                       "(dprec_torch.data.validation) and report one test run")
        bad = [r.path for r in self.runs if not math.isfinite(r.epsilon)]
        if bad:
            out.append(f"{len(bad)} run(s) have no established finite epsilon (e.g. {bad[0]}): the ledger total is inf")
        return out


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _epsilon(value: Any) -> float:
    """A reported epsilon as a float; ``None`` or garbage (not established) is ``inf``."""
    eps = _float_or_none(value)
    return math.inf if eps is None else eps


def is_per_query(privacy: dict[str, Any]) -> bool:
    """True when the report's ``epsilon`` covers ONE released value (Park & Acharya's per-query figure)."""
    scope = str(privacy.get("epsilon_scope", "")).lower()
    return scope.startswith(("per released prediction", "per query", "per released value")) and "released_values" in privacy


def charged_epsilon(privacy: dict[str, Any]) -> float:
    """The epsilon one trained model's report costs: composed over its releases for per-query mechanisms."""
    eps = _epsilon(privacy.get("epsilon"))
    if is_per_query(privacy) and math.isfinite(eps):
        return eps * max(int(privacy.get("released_values") or 0), 1)
    return eps


def run_delta(privacy: dict[str, Any]) -> float:
    """The report's delta; NaN when a finite epsilon comes without one (not established, never booked as 0)."""
    delta = privacy.get("delta")
    if delta is not None:
        return float(delta)
    eps = privacy.get("epsilon")
    return 0.0 if eps is None or not math.isfinite(_epsilon(eps)) else math.nan


def _delta_text(delta: float) -> str:
    return "not established" if math.isnan(delta) else f"{delta:.3g}"


# ------------------------------------------------------------------ releases of the same people
#: the accountants whose histories compose by concatenation (Opacus's, :mod:`dprec_torch.privacy.opacus_accounting`)
HISTORY_ACCOUNTANTS = ("rdp", "prv")


def joint_epsilon(reports: list[dict[str, Any]], what: str = "models") -> dict[str, Any]:
    """The joint (epsilon, delta) of releasing everything ``reports`` describe, releases about the SAME people (the
    fold models of one ``data.fold=all`` run, the jobs of a sweep on one dataset). Each report is a mechanism's
    ``privacy_report()`` (or a record this function returned: composition is associative), composed as the mechanisms'
    own accountant does:

    * every report carries ``accountant_history`` (subsampled-Gaussian (sigma, q, steps) entries, the item means
      included) under one Opacus accountant ``accountant_name`` (``rdp``/``prv``) and one ``delta``: the histories are
      concatenated and that accountant gives epsilon at that delta
      (:func:`~dprec_torch.privacy.calibration.gaussian_epsilon`, the figure each report's own ``epsilon`` is);
    * every ``delta`` is 0 (pure epsilon, e.g. Laplace DP-SGD and its Laplace item means): the sum of the epsilons
      (exact basic composition), a per-query report counted over all its released values (:func:`charged_epsilon`);
    * otherwise: basic composition, (sum eps_k, sum delta_k); any ``epsilon`` null (not established): null; any
      infinite (not private): inf.

    Returns ``{"epsilon", "delta", "models", "epsilon_per_model", "method"}`` plus, for a history composition,
    ``accountant_name`` and ``accountant_history`` (the concatenation)."""
    per_model = [None if r.get("epsilon") is None else charged_epsilon(r) for r in reports]
    out: dict[str, Any] = {"models": len(reports), "epsilon_per_model": per_model}
    if not reports:
        return {**out, "epsilon": 0.0, "delta": 0.0, "method": f"no {what} released"}
    if any(e is None for e in per_model):
        return {**out, "epsilon": None, "delta": None,
                "method": f"not established: a {what[:-1]}'s epsilon is null, so nothing is defended for them together"}
    if any(math.isinf(e) or math.isnan(e) for e in per_model):
        return {**out, "epsilon": math.inf, "delta": None, "method": f"not private: a {what[:-1]}'s epsilon is inf"}
    deltas = [_float_or_none(r.get("delta")) for r in reports]
    names = {r.get("accountant_name") for r in reports}
    histories = [r.get("accountant_history") for r in reports]
    if (len(names) == 1 and next(iter(names)) in HISTORY_ACCOUNTANTS and all(h for h in histories)
            and deltas[0] is not None and len(set(deltas)) == 1):
        from dprec_torch.privacy.calibration import gaussian_epsilon

        name, delta = next(iter(names)), deltas[0]
        history = [[float(s), float(q), int(n)] for h in histories for s, q, n in h]
        eps = gaussian_epsilon(history, delta, name)
        return {**out, "epsilon": eps, "delta": delta, "accountant_name": name, "accountant_history": history,
                "method": (f"Opacus {name.upper()} accountant over the concatenated histories of the {len(reports)} {what} "
                           "(each one's item means and steps), the accountant each reports its own epsilon by")}
    total = float(sum(per_model))  # type: ignore[arg-type]
    if all(d == 0.0 for d in deltas):
        return {**out, "epsilon": total, "delta": 0.0,
                "method": f"basic composition of pure epsilon over the {len(reports)} {what} (exact: the sum)"}
    delta_sum = math.nan if any(d is None for d in deltas) else float(sum(deltas))  # type: ignore[arg-type]
    return {**out, "epsilon": total, "delta": None if math.isnan(delta_sum) else delta_sum,
            "method": (f"basic composition over the {len(reports)} {what}: (sum epsilon, sum delta)"
                       + ("; a delta is not established" if math.isnan(delta_sum) else ""))}


def run_privacy(reports: list[dict[str, Any]], folds: list[Any] | None = None) -> dict[str, Any]:
    """The run-level ``metrics.json["privacy"]`` of a run that trained one model per fold (``reports``: each fold's
    ``privacy_report()``, in fold order; ``folds``: their ids). One model: its report as it is. Several
    (``data.fold=all``, trained on the SAME people, so released together): fold 1's report with ``epsilon`` and
    ``delta`` replaced by the joint figure of every fold's whole release (item means included) by the mechanism's
    accountant (:func:`joint_epsilon`), and:

    * ``epsilon_per_fold``: each fold model's own epsilon (a per-query report's composed over its released values);
    * ``epsilon_per_model``: the largest of them (what publishing any ONE fold model costs; null if any is null);
    * ``delta_per_model``; ``accountant_history`` the concatenation (so the record's ``epsilon`` is its composition)
      and ``accountant_history_per_model`` fold 1's;
    * ``epsilon_scope`` "joint: ..." (a per-query report's own scope moves to ``epsilon_scope_per_model``);
    * ``joint``: ``{"models", "folds", "epsilon", "delta", "method", "statement"}`` -- the ledger charges this once."""
    first = dict(reports[0])
    if len(reports) < 2:
        return first
    k = len(reports)
    folds = list(folds) if folds is not None else list(range(1, k + 1))
    joint = joint_epsilon(reports, what="fold models")
    eps, delta, per = joint["epsilon"], joint["delta"], joint["epsilon_per_model"]
    one = None if any(e is None for e in per) else max(per)
    rel = first.get("relation") or "no"
    fold_text = ", ".join(map(str, folds))
    if eps is None:
        statement = (f"This run released {k} models (folds {fold_text}) trained on the same people; no epsilon is "
                     "established for one of them, so none is for all of them together (epsilon null).")
    elif math.isinf(eps):
        statement = f"This run released {k} models (folds {fold_text}); they are not private (epsilon inf)."
    else:
        one_text = "" if one is None else f"{one:.4g}" + ("" if joint["delta"] == 0 else f" at delta = {first.get('delta')}")
        statement = (f"This run released {k} models (folds {fold_text}), each trained on the same people (every fold's "
                     f"training set holds ratings of the same users), so their guarantees compose: releasing all of them "
                     f"is epsilon = {eps:.4g}" + ("" if delta == 0 else f", delta = {delta:g}") + f" ({rel} level; "
                     f"{joint['method']}). Each fold model alone: epsilon = {one_text}. Publish one fold model to spend "
                     "only its own epsilon.")
    record = {**first, "epsilon_per_fold": per, "epsilon_per_model": one, "delta_per_model": first.get("delta"),
              "joint": {"models": k, "folds": folds, "epsilon": eps, "delta": delta, "method": joint["method"],
                        "statement": statement}}
    if eps is not None and math.isfinite(eps):
        record.update(epsilon=eps, delta=delta,
                      epsilon_scope=f"joint: all {k} fold models this run released (folds {fold_text}), which share people")
        if "epsilon_scope" in first:
            record["epsilon_scope_per_model"] = first["epsilon_scope"]
        if "accountant_history" in joint:
            record.update(accountant_history=joint["accountant_history"],
                          accountant_history_per_model=first.get("accountant_history"))
    elif eps is None:
        record["epsilon"] = None
    record["analysis"] = f"{first.get('analysis', '')} {statement}".strip()
    return record


def read_run(path: Path) -> LedgerRun | None:
    """One ``metrics.json`` as a ledger line (None for files without a privacy record)."""
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    priv = m.get("privacy")
    if not isinstance(priv, dict):
        return None
    data = str(m.get("data", "?"))
    validation = data.endswith(VALIDATION_SUFFIX)
    base = data[: -len(VALIDATION_SUFFIX)] if validation else data
    fold_records = [f for f in m.get("folds", []) if isinstance(f, dict)]
    folds = tuple(sorted(int(f["fold"]) for f in fold_records if "fold" in f)) or (0,)
    joint = priv.get("joint")
    rel = priv.get("relation")
    rel = rel.split()[0] if isinstance(rel, str) and rel else None
    nominal = m.get("epsilon")
    nominal = None if nominal is None else _epsilon(nominal)
    if isinstance(joint, dict):  # a multi-fold run's record (run_privacy): its joint figure, charged once
        eps = _epsilon(joint.get("epsilon"))
        delta = run_delta({"epsilon": joint.get("epsilon"), "delta": joint.get("delta")})
        return LedgerRun(str(path), base, folds, str(m.get("mechanism")), rel, eps, delta, validation, m.get("test_rmse"),
                         str(m.get("model", "?")), nominal, int(joint.get("models") or len(fold_records) or 1),
                         _epsilon(priv.get("epsilon_per_model")), _history(priv))
    per_model = charged_epsilon(priv)
    # a record written before the joint figure (module docstring): a fold's own privacy record wins over the run's
    charges = [charged_epsilon(f["privacy"]) if isinstance(f.get("privacy"), dict)
               else _epsilon(f["privacy_epsilon"]) if "privacy_epsilon" in f else per_model
               for f in fold_records] or [per_model]
    delta = run_delta(priv) * len(charges)
    return LedgerRun(str(path), base, folds, str(m.get("mechanism")), rel, float(sum(charges)), delta, validation,
                     m.get("test_rmse"), str(m.get("model", "?")), nominal, len(charges), per_model,
                     _history(priv) if len(charges) == 1 else None)


def _history(priv: dict[str, Any]) -> dict[str, Any] | None:
    """What :func:`joint_epsilon` composes for a run: its (joint) epsilon, delta and accountant history (None without
    a history: such runs compose by basic composition)."""
    if not priv.get("accountant_history") or priv.get("accountant_name") is None:
        return None
    eps = (priv.get("joint") or priv).get("epsilon")
    return {"epsilon": eps, "delta": priv.get("delta"), "accountant_name": priv["accountant_name"],
            "accountant_history": priv["accountant_history"]}


def collect(sweep_dir: str | Path) -> list[LedgerEntry]:
    """Every ``metrics.json`` under ``sweep_dir``, grouped by dataset (the population of people)."""
    entries: dict[str, LedgerEntry] = {}
    for run in filter(None, map(read_run, sorted(Path(sweep_dir).rglob("metrics.json")))):
        entries.setdefault(run.data, LedgerEntry(run.data)).runs.append(run)
    return list(entries.values())


def _entry_record(e: LedgerEntry, tuning: list, warnings: list, **composed: Any) -> dict[str, Any]:
    """One dataset's line of the report: its runs, totals at user and rating level (``composed`` when given), warnings."""
    eu, du = e.total("user")
    er, _ = e.total("rating")
    return {"data": e.data, "folds": list(e.folds), "runs": len(e.runs), "validation_runs": len(e.runs) - len(e.test_runs),
            "models": sum(r.models for r in e.runs), "epsilon_user_level": eu, "epsilon_rating_level": er, "delta": du, **composed,
            "per_run": [{"path": r.path, "mechanism": r.mechanism, "relation": r.relation, "epsilon": r.epsilon,
                         "models": r.models, "epsilon_per_model": r.epsilon_per_model, "folds": list(r.folds),
                         "delta": r.delta, "validation": r.validation, "test_rmse": r.test_rmse} for r in e.runs],
            "tuning": tuning, "warnings": warnings}


def ledger_report(sweep_dir: str | Path) -> dict[str, Any]:
    """The ledger as a dict: per dataset the runs, totals at user and rating level, warnings."""
    entries = [_entry_record(e, e.tuning(), e.warnings(), composed=e.composed()) for e in collect(sweep_dir)]
    return {"sweep_dir": str(sweep_dir), "entries": entries}


#: the statement every ledger (and so every sweep report) prints above its table
JOBS_COMPOSE = ("Runs (sweep jobs, folds, validation runs) on the same dataset share people, so their epsilons compose: "
                "publishing all of them costs the line's total, not any one run's epsilon; a data.fold=all run is "
                "charged its joint epsilon over its fold models.")


def format_ledger(report: dict[str, Any]) -> str:
    """A short text table (one line per dataset, then its warnings)."""
    lines = [f"privacy ledger for {report['sweep_dir']} (one line per dataset: every fold trains on the same people)",
             JOBS_COMPOSE,
             f"{'data':<14} {'folds':<10} {'runs':>5} {'val':>4} {'models':>6} {'eps(user)':>10} {'eps(rating)':>12} {'delta':>9}"]
    for e in report["entries"]:
        lines.append(f"{e['data']:<14} {','.join(map(str, e['folds'])):<10} {e['runs']:>5} {e['validation_runs']:>4} "
                     f"{e.get('models', e['runs']):>6} {e['epsilon_user_level']:>10.4g} {e['epsilon_rating_level']:>12.4g} "
                     f"{_delta_text(e['delta']):>9}")
        c = e.get("composed")
        if c and c.get("epsilon") is not None:
            lines.append(f"  composed by their accountant: eps={c['epsilon']:.4g} at delta={_delta_text(c['delta'])} "
                         f"({c['relation']} level; {c['method']}); the columns above are the basic sum")
        for t in e.get("tuning", []):
            nominal = "?" if t["epsilon_nominal"] is None else f"{t['epsilon_nominal']:g}"
            lines.append(f"  tuning {t['method']} eps={nominal}: {t['statement']}")
        lines += [f"  WARNING: {w}" for w in e["warnings"]]
    return "\n".join(lines)


def composition_lines(report: dict[str, Any]) -> list[str]:
    """A sweep's jobs compose when they share people: :data:`JOBS_COMPOSE`, then per dataset what all its runs cost
    together (the basic sum, and the accountant's composition where :meth:`LedgerEntry.composed` gives one)."""
    lines = [JOBS_COMPOSE]
    for e in report["entries"]:
        text = (f"{e['data']}: {e['runs']} run(s), {e.get('models', e['runs'])} model(s) on the same people: "
                f"epsilon = {e['epsilon_user_level']:.4g} at user level, {e['epsilon_rating_level']:.4g} at rating level, "
                f"delta = {_delta_text(e['delta'])} (basic composition)")
        c = e.get("composed")
        if c and c.get("epsilon") is not None:
            text += f"; by their accountant: epsilon = {c['epsilon']:.4g} at delta = {_delta_text(c['delta'])} ({c['relation']} level)"
        lines.append(text)
    return lines


def merge_legacy(report: dict[str, Any]) -> dict[str, Any]:
    """A ledger report written when entries were keyed by (data, folds), regrouped by dataset (the same people), from
    its ``per_run`` records (one model per fold of the old entry), without any run folder; its ``tuning`` lines and
    warnings are kept as they were (their per-cell statements do not depend on the grouping)."""
    grouped: dict[str, LedgerEntry] = {}
    tuning: dict[str, list] = {}
    warnings: dict[str, list] = {}
    for old in report.get("entries", []):
        folds = tuple(old.get("folds") or (0,))
        entry = grouped.setdefault(old["data"], LedgerEntry(old["data"]))
        for r in old.get("per_run", []):
            if "models" in r:  # already in the new format
                runs, per_model, run_folds = int(r["models"]), _epsilon(r.get("epsilon_per_model")), tuple(r.get("folds", folds))
            else:
                runs, per_model, run_folds = len(folds), _epsilon(r.get("epsilon")), folds
            rel = r.get("relation")
            entry.runs.append(LedgerRun(r["path"], old["data"], run_folds, str(r.get("mechanism")), rel, per_model * runs,
                                        (math.nan if r.get("delta") is None else float(r["delta"])) * runs, bool(r.get("validation")),
                                        r.get("test_rmse"), models=runs, epsilon_per_model=per_model))
        tuning.setdefault(old["data"], []).extend(old.get("tuning", []))
        warnings.setdefault(old["data"], [])
        warnings[old["data"]] += [w for w in old.get("warnings", []) if w not in warnings[old["data"]]]
    return {"sweep_dir": report.get("sweep_dir"),
            "entries": [_entry_record(e, tuning[data], warnings[data]) for data, e in grouped.items()]}
