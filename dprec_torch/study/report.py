"""Collect a sweep's ``metrics.json`` files into RMSE-versus-epsilon tables and figures.

``python scripts/report.py <sweep dir>`` (or ``build_report(dir)``) walks the directory, groups runs by
(data, method = mechanism-model, epsilon), and writes ``report.md``, ``report.csv`` and one
``rmse_vs_epsilon_<data>.png`` per dataset. Every run reports its references on the same folds and k
(``metrics.json["baselines"]``, :mod:`dprec_torch.evaluation.baselines`): the non-private PCC and COS become
horizontal reference lines on the figure (and ``baselines.csv``), the DP item means + user offset at each run's
epsilon a dotted curve (and ``references_dp.csv``). For a two-stage study (``scripts/study.py``) it also tabulates
the configuration chosen per (method, epsilon) on the validation split (``selected.yaml``), and the privacy ledger
covers both stages (``ledger_dir``), including the epsilon spent on tuning.

Method names are ``<mechanism>-<model>`` with the mechanism's config name. ``dpsgd_paper`` and ``sgld_paper`` are
Wang & Tang's Alg. 1 and 2 as printed; ``dpsgd`` and ``sgld`` are the provable forms whose reported epsilon is the
typed one. Runs written before that rename are relabelled ``*_paper`` (:func:`mechanism_name`, :func:`relabel`).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from dprec_torch.errors import ConfigError
from dprec_torch.io import atomic_write_json
from dprec_torch.privacy.ledger import format_ledger, ledger_report, merge_legacy

log = logging.getLogger(__name__)


@dataclass
class Cell:
    rmse: list[float] = field(default_factory=list)
    mae: list[float] = field(default_factory=list)
    eps_guaranteed: set = field(default_factory=set)
    runs: int = 0


#: the paper-faithful forms, as the mechanism names of runs written before the rename
PAPER_FORMS = {"dpsgd": "dpsgd_paper", "sgld": "sgld_paper"}
#: printed under every report table
FORMS_NOTE = ("Methods `dpsgd_paper-*` and `sgld_paper-*` are the PAPER-FAITHFUL forms (Wang & Tang Alg. 1/2 as printed; "
              "with MF: DPSGD-MF of Berlioz et al. and DPPS-MF as the paper ran them): ε is the configured figure and "
              "'ε guaranteed' is what the run defends (none for PNBM). `dpsgd-*`/`sgld-*` are the provable forms; their "
              "'ε guaranteed' is likewise what each run defends: the accountant's figure (at most the configured ε) for "
              "`dpsgd` and for the clipped chain on the low-rank PNBM, none for the posterior-sampling SGLD on full S "
              "or MF (its chain's δ is not established).")
#: earlier wordings of FORMS_NOTE, replaced by ``relabel`` (text only: no number changes)
OLD_FORMS_NOTES = (("Methods `dpsgd_paper-*` and `sgld_paper-*` are the PAPER-FAITHFUL forms (Wang & Tang Alg. 1/2 as "
                    "printed; with MF: DPSGD-MF of Berlioz et al. and DPPS-MF as the paper ran them): ε is the configured "
                    "figure and 'ε guaranteed' is what the run defends (none for PNBM). `dpsgd-*`/`sgld-*` are the provable "
                    "defaults, whose guaranteed ε is the configured one."),)


def mechanism_name(metrics: dict) -> str:
    """A run's mechanism config name; a pre-rename ``dpsgd``/``sgld`` run (a paper-faithful class, told apart by its
    privacy record: the provable ``dpsgd`` reports ``dpsgd_l1 ...``, the provable ``sgld`` a "provable form") gets ``*_paper``."""
    name = str(metrics.get("mechanism", "none"))
    record = str((metrics.get("privacy") or {}).get("mechanism", ""))
    if (name == "dpsgd" and not record.startswith("dpsgd_l1")) or (name == "sgld" and "provable form" not in record):
        return PAPER_FORMS[name]
    return name


def legacy_method(method: str) -> str:
    """``dpsgd-pnbm`` -> ``dpsgd_paper-pnbm`` for a method name read from a report written before the rename."""
    mech, _, model = method.partition("-")
    return f"{PAPER_FORMS.get(mech, mech)}-{model}" if model else method


def _eps(value: object) -> float:
    return float("inf") if value in ("inf", "Infinity") else float(value)  # type: ignore[arg-type]


def collect(sweep_dir: Path) -> tuple[dict, dict, dict]:
    """(cells keyed by (data, method, eps); non-private references keyed by (data, name) -> list of RMSE;
    DP references keyed by (data, label, eps) -> list of RMSE)."""
    cells: dict[tuple[str, str, float], Cell] = defaultdict(Cell)
    baselines: dict[tuple[str, str], list[float]] = defaultdict(list)
    dp_refs: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    files = sorted(Path(sweep_dir).rglob("metrics.json"))
    if not files:
        raise ConfigError(f"no metrics.json under {sweep_dir}; pass the sweep's multirun dir")
    for path in files:
        m = json.loads(path.read_text())
        if "epsilon" not in m or "test_rmse" not in m:
            continue
        method = f"{mechanism_name(m)}-{m['model']}"
        cell = cells[(m["data"], method, _eps(m["epsilon"]))]
        cell.runs += 1
        for f in m["folds"]:
            cell.rmse.append(f["test_rmse"])
            cell.mae.append(f.get("test_mae", float("nan")))
        cell.eps_guaranteed.add(str(m.get("privacy", {}).get("epsilon")))
        info = m.get("baseline_info", {})  # runs written before it: PCC/COS only, both non-private
        for name, b in m.get("baselines", {}).items():
            ref = info.get(name, {})
            if ref.get("private"):
                dp_refs[(m["data"], f"{name} ({ref['relation']})", _eps(ref["epsilon"]))].append(b["rmse"])
            else:
                baselines[(m["data"], name)].append(b["rmse"])
    return cells, baselines, dp_refs


def selection_table(selected_path: Path, ledger: dict) -> list[str]:
    """Markdown rows: per (method, epsilon) the chosen overrides, validation RMSE and tuning epsilon."""
    doc = yaml.safe_load(Path(selected_path).read_text())
    meta = doc.get("study", {})
    tuning = {(t["method"], float(t["epsilon_nominal"])): t for e in ledger["entries"] for t in e.get("tuning", [])}
    lines = ["", "## Stage 1: configuration chosen per ε on the validation split", "",
             f"Grid `{meta.get('grid')}`, sweeper `{meta.get('sweeper')}`, validation split carved from the TRAIN side of "
             f"fold {meta.get('tune_fold')} (`{meta.get('data')}-val`); the chosen configuration is then trained on every fold "
             f"{meta.get('folds')} and scored on its test split (table above). Wall time: stage 1 "
             f"{meta.get('stage1_seconds', float('nan')):.0f} s, stage 2 {meta.get('stage2_seconds', float('nan')):.0f} s.", "",
             "| method | ε | configs tried (failed) | chosen overrides | validation RMSE | ε spent on tuning |",
             "|---|---|---|---|---|---|"]
    for method, per_eps in doc.get("selected", {}).items():
        for eps, c in per_eps.items():
            t = tuning.get((method, float(eps)))
            spent = t["statement"] if t else "–"
            lines.append(f"| {method} | {float(eps):g} | {c['n_configs']} ({c['n_failed']}) | `{' '.join(c['overrides'])}` | "
                         f"{c['validation_rmse']:.4f} | {spent} |")
    return lines


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


def build_report(sweep_dir: str | Path, out_dir: str | Path | None = None, ledger_dir: str | Path | None = None,
                 selected: str | Path | None = None) -> Path:
    """Write report.md / report.csv / figures into ``out_dir`` (default: the sweep dir).

    ``ledger_dir`` (default ``sweep_dir``) is where the privacy ledger looks for runs (a study's whole
    folder, so that stage-1 tuning runs are charged); ``selected`` adds the stage-1 choice table.
    """
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir else sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    cells, baselines, dp_refs = collect(sweep_dir)
    rows = []
    for (data, method, eps), c in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        rows.append({"data": data, "method": method, "epsilon": eps, "rmse_mean": float(np.mean(c.rmse)),
                     "rmse_std": float(np.std(c.rmse)), "mae_mean": float(np.nanmean(c.mae)), "n": len(c.rmse),
                     "epsilon_guaranteed": ";".join(sorted(c.eps_guaranteed))})
    _write_csv(out / "report.csv", list(rows[0]), [list(r.values()) for r in rows])
    lines = ["| data | method | ε | RMSE (mean ± std) | MAE | folds×runs | ε guaranteed |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['data']} | {r['method']} | {r['epsilon']:g} | {r['rmse_mean']:.4f} ± {r['rmse_std']:.4f} | "
                     f"{r['mae_mean']:.4f} | {r['n']} | {r['epsilon_guaranteed']} |")
    _write_csv(out / "baselines.csv", ["data", "method", "rmse_mean", "rmse_std", "n"],
               [[data, name, float(np.mean(vals)), float(np.std(vals)), len(vals)] for (data, name), vals in sorted(baselines.items())])
    for (data, name), vals in sorted(baselines.items()):
        lines.append(f"| {data} | {name} (non-private reference) | – | {np.mean(vals):.4f} ± {np.std(vals):.4f} | | {len(vals)} | ∞ |")
    _write_csv(out / "references_dp.csv", ["data", "method", "epsilon", "rmse_mean", "rmse_std", "n"],
               [[data, name, eps, float(np.mean(vals)), float(np.std(vals)), len(vals)]
                for (data, name, eps), vals in sorted(dp_refs.items())])
    for (data, name, eps), vals in sorted(dp_refs.items()):
        lines.append(f"| {data} | {name}: separate DP release at this ε | {eps:g} | {np.mean(vals):.4f} ± {np.std(vals):.4f} "
                     f"| | {len(vals)} | {eps:g} (δ = 0) |")
    if any(r["method"].split("-", 1)[0] in PAPER_FORMS.values() for r in rows):
        lines += ["", FORMS_NOTE]
    ledger = ledger_report(ledger_dir or sweep_dir)
    if selected is not None and Path(selected).exists():
        lines += selection_table(Path(selected), ledger)
        if Path(selected).resolve() != (out / "selected.yaml").resolve():
            shutil.copyfile(selected, out / "selected.yaml")
    lines += ["", "## Privacy ledger", "", "```", format_ledger(ledger), "```"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    atomic_write_json(out / "ledger.json", ledger)
    _figures(rows, baselines, out, dp_refs)
    log.info("report written to %s", out)
    return out / "report.md"


def _figures(rows: list[dict], baselines: dict, out: Path, dp_refs: dict | None = None) -> None:
    """One RMSE-vs-epsilon figure per dataset: each method's curve, the non-private references (``baselines``:
    (data, name) -> RMSEs) as horizontal lines and the DP references (``dp_refs``: (data, name, eps) -> RMSEs)
    as dotted curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for data in sorted({r["data"] for r in rows}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for method in sorted({r["method"] for r in rows if r["data"] == data}):
            pts = [r for r in rows if r["data"] == data and r["method"] == method and math.isfinite(r["epsilon"])]
            if pts:
                ax.errorbar([p["epsilon"] for p in pts], [p["rmse_mean"] for p in pts], yerr=[p["rmse_std"] for p in pts],
                            marker="o", capsize=3, label=method)
        for (d, name), vals in sorted(baselines.items()):
            if d == data:
                ax.axhline(float(np.mean(vals)), linestyle="--", linewidth=1, label=f"{name} (non-private reference)",
                           color="gray" if name == "PCC" else "black")
        for ref in sorted({name for (d, name, _) in (dp_refs or {}) if d == data}):
            pts = sorted((eps, float(np.mean(v))) for (d, name, eps), v in dp_refs.items()
                         if d == data and name == ref and math.isfinite(eps))
            if pts:
                ax.plot([e for e, _ in pts], [r for _, r in pts], linestyle=":", marker="x", color="dimgray",
                        label=f"{ref} at each ε (separate DP release)")
        ax.set_xscale("log")
        ax.set_xlabel("ε (as configured)")
        ax.set_ylabel("test RMSE")
        ax.set_title(data)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"rmse_vs_epsilon_{data}.png", dpi=120)
        plt.close(fig)


def relabel(folder: str | Path) -> list[str]:
    """Rewrite a report folder written before the rename: ``dpsgd-*``/``sgld-*`` -> ``dpsgd_paper-*``/``sgld_paper-*``
    in ``report.csv``, ``report.md``, ``selected.yaml`` and ``ledger.json``, and redraw the figure from ``report.csv``
    and ``baselines.csv`` (the run folders are not needed). No number changes. Returns the files rewritten."""
    import re

    folder = Path(folder)
    pattern = re.compile(r"(?<![\w./])(dpsgd|sgld)-(pnbm|mf)(?![\w/])")  # a method name, not a run path
    done = []
    for name in ("report.csv", "report.md", "selected.yaml", "ledger.json"):
        path = folder / name
        if path.exists():
            text = path.read_text()
            new = pattern.sub(lambda m: f"{PAPER_FORMS[m.group(1)]}-{m.group(2)}", text)
            new = re.sub(r"(\"mechanism\": \")(dpsgd|sgld)(\")", lambda m: m.group(1) + PAPER_FORMS[m.group(2)] + m.group(3), new)
            if name == "report.md":
                for note in OLD_FORMS_NOTES:
                    new = new.replace(note, FORMS_NOTE)
            if name == "report.md" and FORMS_NOTE not in new:
                new = new.replace("\n\n## ", f"\n\n{FORMS_NOTE}\n\n## ", 1) if "\n\n## " in new else new + f"\n{FORMS_NOTE}\n"
            if new != text:
                path.write_text(new)
                done.append(str(path))
    if (folder / "ledger.json").exists():  # regroup by dataset and reprint the ledger section
        ledger = merge_legacy(json.loads((folder / "ledger.json").read_text()))
        atomic_write_json(folder / "ledger.json", ledger)
        md = folder / "report.md"
        if md.exists() and "## Privacy ledger" in md.read_text():
            head = md.read_text().split("## Privacy ledger", 1)[0]
            md.write_text(head + "## Privacy ledger\n\n```\n" + format_ledger(ledger) + "\n```\n")
        done += [] if str(folder / "ledger.json") in done else [str(folder / "ledger.json")]
    if (folder / "report.csv").exists():
        rows = [{**r, "epsilon": _eps(r["epsilon"]), "rmse_mean": float(r["rmse_mean"]), "rmse_std": float(r["rmse_std"])}
                for r in csv.DictReader(open(folder / "report.csv"))]
        base: dict = defaultdict(list)
        dp: dict = defaultdict(list)
        if (folder / "references_dp.csv").exists():
            for r in csv.DictReader(open(folder / "references_dp.csv")):
                dp[(r["data"], r["method"], _eps(r["epsilon"]))].append(float(r["rmse_mean"]))
        if (folder / "baselines.csv").exists():
            for r in csv.DictReader(open(folder / "baselines.csv")):
                base[(r["data"], r["method"])].append(float(r["rmse_mean"]))
        elif (folder / "report.md").exists():  # older reports kept the baselines only as report.md rows
            for m in re.finditer(r"^\| (\S+) \| (\w+) \(non-private\) \| – \| ([0-9.]+) ±", (folder / "report.md").read_text(), re.M):
                base[(m.group(1), m.group(2))].append(float(m.group(3)))
        _figures(rows, base, folder, dp)
    return done
