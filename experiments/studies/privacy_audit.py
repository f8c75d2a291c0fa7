"""Canary audits of the provable PNBM mechanisms at the edges (issue 15); writes docs/results/privacy/.

    DPREC_DATA=../shared/data python experiments/studies/privacy_audit.py --run [--trials 60] [--tau 30]
    python experiments/studies/privacy_audit.py          # only rebuild the table from docs/results/privacy/*.json

Each audit is the CLI itself, one subprocess per cell:

    python scripts/audit.py mechanism=<m> epsilon=<e> audit.canary=<design> audit.trials=<n> output_dir=<dir>
        (+ ++mechanism.max_user_ratings=<tau> for design=tau)

for m in {dpsgd_l1, gaussian} (PNBM, tuned configs), e in {1, 4}, and the canary designs of
:mod:`dprec_torch.audit.canaries`: ``user`` (5-item profile, D < C: floored), ``floor`` (D = C
exactly at the constant start S = s0 (1 - I)) and ``tau`` (a profile of exactly tau ratings under
the tau cap). An audit whose json already exists is read, not re-run. The table is spliced into
docs/privacy.md between the ``privacy-audit`` markers.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dprec_torch.study.markers import splice  # noqa: E402
from dprec_torch.io import atomic_write_json  # noqa: E402

OUT = ROOT / "docs" / "results" / "privacy"
MECHANISMS = ("dpsgd_l1", "gaussian")
EPSILONS = ("1", "4")
DESIGNS = ("user", "floor", "tau")
DESIGN_WORDS = {"user": "new user, 5 items + canary (D < C, floored)",
                "floor": "new user, C/s0 = 10 items + canary: D = C exactly at step 1",
                "tau": "new user with exactly tau ratings, tau cap on"}


def result_path(mech: str, eps: str, design: str) -> Path:
    return OUT / f"audit_{mech}_eps{eps}_{design}.json"


def command(mech: str, eps: str, design: str, trials: int, tau: int, out_dir: Path) -> list[str]:
    cmd = [sys.executable, "scripts/audit.py", f"mechanism={mech}", f"epsilon={eps}", f"audit.canary={design}",
           f"audit.trials={trials}", f"output_dir={out_dir}"]
    if design == "tau":
        cmd.append(f"++mechanism.max_user_ratings={tau}")
    return cmd


def run_all(trials: int, tau: int, work: Path) -> None:
    for mech in MECHANISMS:
        for eps in EPSILONS:
            for design in DESIGNS:
                dest = result_path(mech, eps, design)
                if dest.exists():
                    continue
                out_dir = work / f"{mech}_eps{eps}_{design}"
                cmd = command(mech, eps, design, trials, tau, out_dir)
                logging.info("running %s", " ".join(cmd[1:]))
                subprocess.run(cmd, cwd=ROOT, check=True)
                record = json.loads((out_dir / "audit.json").read_text())
                record["command"] = "python " + " ".join(c for c in cmd[1:] if not c.startswith("output_dir="))
                record["tau"] = tau if design == "tau" else None
                atomic_write_json(dest, record)
                shutil.rmtree(out_dir, ignore_errors=True)


def table() -> str:
    lines = ["| mechanism (PNBM) | canary design | ε claimed | ε lower bound (95%) | correct / guesses |",
             "|---|---|---|---|---|"]
    n = 0
    for mech in MECHANISMS:
        for eps in EPSILONS:
            for design in DESIGNS:
                p = result_path(mech, eps, design)
                if not p.exists():
                    continue
                r = json.loads(p.read_text())
                n = r["trials"]
                words = DESIGN_WORDS[design] + (f" (tau = {r['tau']})" if r.get("tau") else "")
                lines.append(f"| `{mech}` | `{design}`: {words} | {float(r['epsilon_claimed']):.3g} | "
                             f"**{r['epsilon_lower_bound']:.2f}** | {r['correct']}/{r['guesses']} |")
    head = (f"Audit of the provable variants at ε ∈ {{1, 4}} (`python experiments/studies/privacy_audit.py --run`: {n} trainings × "
            "50 canaries per cell on the tiny synthetic set, Clopper–Pearson α = 0.05; one json per cell in "
            "`docs/results/privacy/`, with its exact command):")
    return head + "\n\n" + "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="run the missing audits (else only rebuild the table)")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--tau", type=int, default=30)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "privacy_audit")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    if args.run:
        run_all(args.trials, args.tau, args.work)
    body = table()
    splice(ROOT / "docs" / "privacy.md", "privacy-audit", body)
    print(body)


if __name__ == "__main__":
    main()
