"""PNCF, McSherry-Mironov and D2P on ML-100K u1 at epsilon in {inf, 10, 3, 1}; writes docs/results/other_systems.md.

    DPREC_DATA=../shared/data python experiments/studies/other_systems.py

Each cell is ``python train.py model=<m> epsilon=<e> <setting>`` (seed 0, defaults otherwise; D2P with
``eval.topn=5``). epsilon=inf is the same class without noise: the non-private counterpart. PNCF runs twice:
with our defaults (item-based, w = max(s_k, 0)) and in Sun's experimental setting (user-based, w = 0.01;
Sun used k = 5, 7, 9 on 20 Netflix records, we keep k = 5). For rating predictors the cell also gives the
share of test pairs answered by the fallback mean (``test_fallback_rate``). The privacy line says what is
defended: a finite epsilon only where the mechanism defends one end to end; otherwise the paper's nominal
value with its condition. The table is spliced into docs/other_systems.md between the other-systems markers;
docs/other_systems.md has the wider sweeps (k, p, p*, lambda, seeds) and the claim checks.
"""

from __future__ import annotations

import math
from pathlib import Path

from hydra import compose, initialize_config_dir

from dprec_torch.study.markers import splice
from dprec_torch.training.run import train

ROOT = Path(__file__).resolve().parents[2]
EPS = ("inf", "10", "3", "1")
# label -> (model, extra overrides, metric keys)
RATING = ("test_rmse", "test_mae")
SYSTEMS = {
    "pncf (item-based, w = max(s_k, 0))": ("pncf", [], RATING),
    "pncf, Sun's setting (user-based, w = 0.01)": ("pncf", ["model.mode=user", "model.w=0.01"], RATING),
    "mcsherry": ("mcsherry", [], RATING),
    "d2p": ("d2p", ["eval.topn=5"], ("test_precision@5", "test_recall@5")),
}
#: how each system's paper-level epsilon is conditioned when no end-to-end epsilon is defended
NOMINAL = {"pncf": "per query, local sensitivity", "d2p": "Eq. (12), if the groups were public"}


def privacy_cell(model: str, privacy: dict) -> str:
    eps = privacy.get("epsilon")
    if eps is not None and math.isfinite(float(eps)):
        return f"ε defended: {float(eps):.3g}"
    nominal = privacy.get("epsilon_nominal")
    if nominal is None:
        return "ε: –"
    return f"ε defended: none (nominal {float(nominal):.3g}: {NOMINAL[model]})"


def main() -> None:
    rows = []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for label, (model, extra, keys) in SYSTEMS.items():
            cells = []
            for eps in EPS:
                tag = f"{model}{'_sun' if 'model.mode=user' in extra else ''}_{eps}"
                cfg = compose(config_name="config", overrides=[f"model={model}", f"epsilon={eps}", "compare_baselines=false",
                                                                "tensorboard=false", f"output_dir={ROOT}/outputs/studies/other/{tag}", *extra])
                m = train(cfg)
                cell = f"{m[keys[0]]:.4f} / {m[keys[1]]:.4f}"
                if "test_fallback_rate" in m:
                    cell += f", fallback {100 * m['test_fallback_rate']:.1f}%"
                privacy = "" if eps == "inf" else f" ({privacy_cell(model, m['privacy'])})"
                cells.append(cell + privacy)
            metric = " / ".join(k.replace("test_", "") for k in keys)
            rows.append(f"| {label} | {metric} | " + " | ".join(cells) + " |")
    md = "\n".join(["| system | metric | ε=∞ (non-private) | ε=10 | ε=3 | ε=1 |", "|---|---|---|---|---|---|", *rows])
    (ROOT / "docs" / "results" / "other_systems.md").write_text(md + "\n")
    splice(ROOT / "docs" / "other_systems.md", "other-systems", md)
    print(md)


if __name__ == "__main__":
    main()
