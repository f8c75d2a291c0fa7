"""PNCF, McSherry-Mironov and D2P on ML-100K u1 at epsilon in {inf, 10, 3, 1}; writes results/other_systems.md.

    DPREC_DATA=../shared/data python studies/other_systems.py

Each cell is ``python train.py model=<m> epsilon=<e>`` (seed 0, defaults otherwise; D2P with
``eval.topn=5``). epsilon=inf is the same class without noise: the non-private counterpart.
The table is spliced into README.md between the other-systems markers; docs/other_systems.md
has the wider sweeps (k, p, p*, lambda, seeds) and the claim checks.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from dprec_torch.training.run import train
from dprec_torch.evaluation.markers import splice

ROOT = Path(__file__).resolve().parents[1]
EPS = ("inf", "10", "3", "1")
SYSTEMS = {"pncf": ("test_rmse", "test_mae"), "mcsherry": ("test_rmse", "test_mae"), "d2p": ("test_precision@5", "test_recall@5")}


def main() -> None:
    rows = []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for model, keys in SYSTEMS.items():
            cells = []
            for eps in EPS:
                extra = ["eval.topn=5"] if model == "d2p" else []
                cfg = compose(config_name="config", overrides=[f"model={model}", f"epsilon={eps}", "compare_baselines=false",
                                                                "tensorboard=false", f"output_dir={ROOT}/outputs/studies/other/{model}_{eps}", *extra])
                m = train(cfg)
                guaranteed = m["privacy"].get("epsilon")
                g = "–" if eps == "inf" else ("none" if guaranteed in (None, float("inf"), "inf") else f"{float(guaranteed):.3g}")
                cells.append(f"{m[keys[0]]:.4f} / {m[keys[1]]:.4f} (ε guaranteed: {g})")
            label = " / ".join(k.replace("test_", "") for k in keys)
            rows.append(f"| {model} | {label} | " + " | ".join(cells) + " |")
    md = "\n".join(["| system | metric | ε=∞ (non-private) | ε=10 | ε=3 | ε=1 |", "|---|---|---|---|---|---|", *rows])
    (ROOT / "results" / "other_systems.md").write_text(md + "\n")
    splice(ROOT / "README.md", "other-systems", md)
    print(md)


if __name__ == "__main__":
    main()
