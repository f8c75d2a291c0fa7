"""Privacy ledger: what a whole sweep spent on the same data, and whether it tuned on the test split.

Every run writes ``metrics.json`` with ``privacy`` (its mechanism's report: ``epsilon``, ``delta``,
``relation``). Runs on the same users compose: by basic composition a sweep of runs with
(eps_k, delta_k) on the same data is (sum eps_k, sum delta_k)-DP, and choosing the best run
afterwards is post-processing of all of them (so the SUM is what the released choice costs,
not the chosen run's eps). Units: a user-level eps_k gives 2 eps_k at rating level (a changed
rating is a changed profile); a rating-level guarantee gives nothing at user level. A run whose
epsilon is ``None`` (not established) or ``inf`` makes the total ``inf``.

Validation runs (data name ending in ``+validation``, :mod:`dprec_torch.data.validation`) train
on a subset of the same fold's training users, so they are charged to the same ledger entry.
Several runs of the same cell (mechanism, model, nominal epsilon) evaluated on the TEST split of one
dataset trigger a warning: picking among them by ``test_rmse`` tunes hyperparameters on the test set.

Tuning cost (``tuning`` in each entry, the two-stage study of ``study.py``): the validation runs of one
(mechanism, model, nominal epsilon) on one fold are the configurations tried for that cell. Releasing
the model chosen among n of them costs, by basic composition on the same training users,
sum_k eps_k (= n x eps when every configuration has the same eps) at the mechanism's relation, on
the train side of that fold, before the final run's own eps. For mechanisms whose epsilon is null
(the paper-faithful ``dpsgd`` and ``sgld`` on PNBM), nothing is defended, for tuning or otherwise.

``python ledger.py SWEEP_DIR`` prints the table; :func:`ledger_report` returns it as a dict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dprec_torch.data.validation import VALIDATION_SUFFIX


@dataclass
class LedgerRun:
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


@dataclass
class LedgerEntry:
    """All runs on one dataset + folds (the same users)."""

    data: str
    folds: tuple[int, ...]
    runs: list[LedgerRun] = field(default_factory=list)

    def total(self, relation: str) -> tuple[float, float]:
        """(sum eps, sum delta) at ``relation`` level (user or rating) by basic composition."""
        eps, delta = 0.0, sum(r.delta for r in self.runs)
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
            folds = ",".join(map(str, self.folds))
            if all(math.isfinite(e) for e in eps) and all(r.relation == rel for r in runs):
                total = float(sum(eps))
                how = (f"{len(runs)} x {eps[0]:.4g}" if len(set(eps)) == 1 else f"sum over {len(runs)} configs")
                statement = (f"{how} = {total:.4g} ({rel} level, basic composition, train side of fold {folds})")
            else:
                total = math.inf
                statement = f"none defended: the {len(runs)} configs tried have epsilon null (nothing is defended)"
            out.append({"method": f"{mech}-{model}", "mechanism": mech, "model": model, "epsilon_nominal": eps_nom,
                        "configs": len(runs), "relation": rel, "epsilon_tuning": total, "statement": statement})
        return out

    def warnings(self) -> list[str]:
        out = []
        cells: dict[tuple[str, str, float | None], int] = {}
        for r in self.test_runs:
            key = (r.mechanism, r.model, r.epsilon_nominal)
            cells[key] = cells.get(key, 0) + 1
        if any(n > 1 for n in cells.values()):
            out.append(f"{len(self.test_runs)} runs on {self.data} folds {list(self.folds)} were scored on the TEST split, "
                       f"up to {max(cells.values())} of them for the same (mechanism, model, epsilon): "
                       "choosing hyperparameters by their test metrics tunes on the test set; tune with data=<name>-val "
                       "(dprec_torch.data.validation) and report one test run")
        bad = [r.path for r in self.runs if not math.isfinite(r.epsilon)]
        if bad:
            out.append(f"{len(bad)} run(s) have no established finite epsilon (e.g. {bad[0]}): the ledger total is inf")
        return out


def _epsilon(privacy: dict[str, Any]) -> float:
    eps = privacy.get("epsilon")
    if eps is None:
        return math.inf
    try:
        return float(eps)
    except (TypeError, ValueError):
        return math.inf


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
    folds = tuple(sorted(int(f["fold"]) for f in m.get("folds", []) if "fold" in f)) or (0,)
    rel = priv.get("relation")
    rel = rel.split()[0] if isinstance(rel, str) and rel else None
    delta = priv.get("delta") or 0.0
    nominal = m.get("epsilon")
    nominal = None if nominal is None else _epsilon({"epsilon": nominal})
    return LedgerRun(str(path), base, folds, str(m.get("mechanism")), rel, _epsilon(priv), float(delta), validation,
                     m.get("test_rmse"), str(m.get("model", "?")), nominal)


def collect(sweep_dir: str | Path) -> list[LedgerEntry]:
    """Every ``metrics.json`` under ``sweep_dir``, grouped by (dataset, folds)."""
    entries: dict[tuple[str, tuple[int, ...]], LedgerEntry] = {}
    for path in sorted(Path(sweep_dir).rglob("metrics.json")):
        run = read_run(path)
        if run is None:
            continue
        entries.setdefault((run.data, run.folds), LedgerEntry(run.data, run.folds)).runs.append(run)
    return list(entries.values())


def ledger_report(sweep_dir: str | Path) -> dict[str, Any]:
    """The ledger as a dict: per (data, folds) the runs, totals at user and rating level, warnings."""
    out = []
    for e in collect(sweep_dir):
        eu, du = e.total("user")
        er, dr = e.total("rating")
        out.append({"data": e.data, "folds": list(e.folds), "runs": len(e.runs), "validation_runs": len(e.runs) - len(e.test_runs),
                    "epsilon_user_level": eu, "epsilon_rating_level": er, "delta": du,
                    "per_run": [{"path": r.path, "mechanism": r.mechanism, "relation": r.relation, "epsilon": r.epsilon,
                                 "delta": r.delta, "validation": r.validation, "test_rmse": r.test_rmse} for r in e.runs],
                    "tuning": e.tuning(), "warnings": e.warnings()})
    return {"sweep_dir": str(sweep_dir), "entries": out}


def format_ledger(report: dict[str, Any]) -> str:
    """A short text table (one line per dataset, then its warnings)."""
    lines = [f"privacy ledger for {report['sweep_dir']}",
             f"{'data':<14} {'folds':<8} {'runs':>5} {'val':>4} {'eps(user)':>10} {'eps(rating)':>12} {'delta':>9}"]
    for e in report["entries"]:
        lines.append(f"{e['data']:<14} {','.join(map(str, e['folds'])):<8} {e['runs']:>5} {e['validation_runs']:>4} "
                     f"{e['epsilon_user_level']:>10.4g} {e['epsilon_rating_level']:>12.4g} {e['delta']:>9.3g}")
        for t in e.get("tuning", []):
            nominal = "?" if t["epsilon_nominal"] is None else f"{t['epsilon_nominal']:g}"
            lines.append(f"  tuning {t['method']} eps={nominal}: {t['statement']}")
        lines += [f"  WARNING: {w}" for w in e["warnings"]]
    return "\n".join(lines)
