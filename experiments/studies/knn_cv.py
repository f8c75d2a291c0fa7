"""PCC and COS item-kNN (k = 900) cross-validated on the five official ML-100K folds.

    DPREC_DATA=../shared/data python experiments/studies/knn_cv.py

Writes docs/results/knn_cv.md and splices it into docs/results.md between the knn-cv markers.
"""

from __future__ import annotations

from pathlib import Path

from dprec_torch.data.movielens import load_movielens
from dprec_torch.evaluation.cross_validate import cross_validate
from dprec_torch.predictors.knn import ItemKNN
from dprec_torch.study.markers import splice

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    folds = load_movielens("ml-100k", fold="all").folds
    lines = ["| method | u1 | u2 | u3 | u4 | u5 | mean ± std RMSE | mean MAE | mean fit s |", "|---|---|---|---|---|---|---|---|---|"]
    for sim, name in (("pearson", "PCC"), ("cosine", "COS")):
        cv = cross_validate(lambda: ItemKNN(sim, k=900), folds)
        per = " | ".join(f"{f.metrics['rmse']:.4f}" for f in cv.folds)
        fit = sum(f.fit_seconds for f in cv.folds) / len(cv.folds)
        lines.append(f"| {name} | {per} | {cv.mean('rmse'):.4f} ± {cv.std('rmse'):.4f} | {cv.mean('mae'):.4f} | {fit:.2f} |")
    md = "\n".join(lines)
    (ROOT / "docs" / "results").mkdir(exist_ok=True)
    (ROOT / "docs" / "results" / "knn_cv.md").write_text(md + "\n")
    splice(ROOT / "docs" / "results.md", "knn-cv", md)
    print(md)


if __name__ == "__main__":
    main()
