"""Copy benchmark tables (``docs/results/benchmarks/bench-<tag>.md``) into docs/performance.md,
and derive the issue's targets table from the JSON files.

    python experiments/benchmarks/publish.py
    python experiments/benchmarks/publish.py --only speed-targets     # just the current speed issue's targets table
    python experiments/benchmarks/publish.py --main cpu-main-t1 --t2 cpu-syn1m-t2 --scaling cpu-scaling-t1 \\
        --parity cpu-parity-none cpu-parity-dpsgd

docs/performance.md's ``main``, ``t2``, ``ml1m-t2``,
``parity``, ``scaling``, ``targets``, ``gpu``, ``sweep-cpu``, ``startup-cpu``, ``startup-ml100k`` and ``speed-targets`` blocks are
rewritten; numbers are never typed by hand. ``speed-targets`` (``speed_targets``) reads the files of ``SPEED_JSON``,
each written by its command in ``SPEED_COMMANDS``; ``--only speed-targets`` rewrites that block alone.
The ``gpu`` block comes from ``docs/results/benchmarks/gpu-check.json`` (``experiments/benchmarks/gpu_check.sh`` on a
GPU machine; a ``gpu-check-rerun.json`` of some stages is laid over it); without that file it says
the GPU rows are pending.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dprec_torch.study.markers import splice  # noqa: E402

RESULTS = ROOT / "docs" / "results" / "benchmarks"
RSS_LIMIT_MIB = 1.5e9 / 2**20  # "1.5 GB" read as 1.5e9 bytes, the stricter reading


def read(tag: str, ext: str):
    path = RESULTS / f"bench-{tag}.{ext}"
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run experiments/benchmarks/bench.py --tag {tag} first")
    return json.loads(path.read_text()) if ext == "json" else path.read_text()


def cases(tag: str) -> dict[str, dict]:
    return {r["case"]: r for r in read(tag, "json")["rows"]}


def yes(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def targets(main: dict[str, dict], t2: dict[str, dict] | None, parity: list[dict[str, dict]],
            repeated: dict[str, dict] | None = None) -> str:
    """Issue 6's CPU targets, each with the figure behind it (from the benchmark JSON files).

    ``repeated``: a separate run of just the target's two cases with more repeats; shown in its
    own rows next to the main table's run, never instead of it.
    """
    lines = ["| target (issue 6) | figure | verdict |", "|---|---|---|"]
    n_rep = max((r.get("runs", 1) for r in (repeated or {}).values()), default=0)
    for label, runs in (("1 thread", main), ("2 threads", t2), (f"1 thread, separate run of these two cases, {n_rep} repeats", repeated)):
        for data, name in (("ml1m", "ML-1M"), ("syn1m", "ML-1M-size")):
            if not runs:
                continue
            s, d = runs.get(f"pnbm-dpsgd-{data}-sparse"), runs.get(f"pnbm-dpsgd-{data}-dense")
            if not (s and d):
                continue
            ratio = d["seconds_per_epoch"] / s["seconds_per_epoch"]
            lines.append(f"| {name} DPSGD-PNBM full-batch epoch ≥ 10× the dense epoch ({label}) | "
                         f"{s['seconds_per_epoch']:.2f} s vs {d['seconds_per_epoch']:.2f} s = {ratio:.1f}× | {yes(ratio >= 10)} |")
            dr = abs(s["test_rmse"] - d["test_rmse"])
            lines.append(f"| {name}: test RMSE within 0.002 of the dense epoch ({label}) | |Δ| = {dr:.1e} | {yes(dr <= 0.002)} |")
            lines.append(f"| {name}: peak RSS ≤ 1.5 GB ({label}) | {s['peak_rss_mb']:.0f} MiB (limit {RSS_LIMIT_MIB:.0f} MiB) | "
                         f"{yes(s['peak_rss_mb'] <= RSS_LIMIT_MIB)} |")
    for runs in parity:
        for r in runs.values():
            if r["kind"] != "pnbmtopk":
                continue
            d = runs.get(f"pnbm-{r['mechanism']}-{r['data']}-sparse")
            if not d:
                continue
            dr = r["test_rmse"] - d["test_rmse"]
            under = r["peak_rss_mb"] < d["peak_rss_mb"]
            verdict = yes(under and abs(dr) <= 0.005)
            if under and dr < -0.005:  # outside the band, but on the good side: say so rather than "not met"
                verdict = f"**not within 0.005: top-k better by {-dr:.4f}**"
            lines.append(f"| top-k S ({r['data']}, {r['mechanism']}, k = {r['sparse_k']}, {r['epochs']} epoch(s)): "
                         f"memory under dense, |ΔRMSE| ≤ 0.005 | peak {r['peak_rss_mb']:.0f} vs {d['peak_rss_mb']:.0f} MiB, "
                         f"ΔRMSE {dr:+.4f} | {verdict} |")
    for data, name in (("ml1m", "ML-1M"), ("syn1m", "ML-1M-size")):
        for sim in ("pcc", "cos"):
            f, lp = main.get(f"{sim}-{data}-fast"), main.get(f"{sim}-{data}-loop")
            if f and lp:
                ratio = lp["fit_predict_seconds"] / f["fit_predict_seconds"]
                lines.append(f"| {sim.upper()} fit+predict on {name} ≥ 10× a per-rating loop | {f['fit_predict_seconds']:.2f} s vs "
                             f"{lp['fit_predict_seconds']:.0f} s (loop extrapolated) = {ratio:.0f}× | {yes(ratio >= 10)} |")
    if not any(k.endswith("-ml1m-sparse") for k in main):
        lines.append("| the same targets on real ML-1M | not measured: ML-1M is not on this machine's disk and it has no "
                     "network (the `ml1m` rows appear when `DPREC_DATA` holds `ml-1m/`) | not yet measured |")
    lines.append("| GPU targets (issue 18) | the *GPU (issue 18)* block below, from `experiments/benchmarks/gpu_check.sh` "
                 "| there, per target |")
    return "\n".join(lines)


CPU_EPOCH_TARGET = 10.0  # issue 28, 1: the CPU epoch on ML-1M >= 10x the dense epoch (the goal is 20x)
CPU_EPOCH_GOAL = 20.0
ISSUE28_MECHANISMS = (("none", "none"), ("dpsgd", "dpsgd_paper"), ("sgld", "sgld_paper"))  # case name -> mechanism


def cpu_epoch_targets(runs: dict[str, dict]) -> str:
    """Issue 28's CPU rows: ``none``, ``dpsgd_paper`` and ``sgld_paper`` on real ML-1M, each beside the dense epoch
    run in the same invocation (``bench.py --tag cpu-ml1m-t2``)."""
    lines = ["| target (issue 28) | figure | verdict |", "|---|---|---|"]
    threads = {r.get("threads") for r in runs.values()}
    for case, mech in ISSUE28_MECHANISMS:
        s, d = runs.get(f"pnbm-{case}-ml1m-sparse"), runs.get(f"pnbm-{case}-ml1m-dense")
        if not (s and d):
            lines.append(f"| ML-1M `{mech}` epoch ≥ {CPU_EPOCH_TARGET:g}× the dense epoch | not in this run | not yet measured |")
            continue
        ratio = d["seconds_per_epoch"] / s["seconds_per_epoch"]
        goal = " (goal 20×: met)" if ratio >= CPU_EPOCH_GOAL else ""
        lines.append(f"| ML-1M `{mech}` full-batch epoch ≥ {CPU_EPOCH_TARGET:g}× the dense epoch "
                     f"({'/'.join(str(t) for t in sorted(threads))} threads) | {s['seconds_per_epoch']:.3f} s vs "
                     f"{d['seconds_per_epoch']:.2f} s = {ratio:.1f}×{goal} | {yes(ratio >= CPU_EPOCH_TARGET)} |")
        dr = abs(s["test_rmse"] - d["test_rmse"])
        lines.append(f"| ML-1M `{mech}`: the same test RMSE as the dense epoch (same noise draws) | |Δ| = {dr:.1e} | "
                     f"{yes(dr <= 1e-6)} |")
    return "\n".join(lines)


GPU_JSON = RESULTS / "gpu-check.json"  # written by experiments/benchmarks/gpu_check.sh on a machine with a GPU
GPU_TARGETS = {"ml1m_epoch": 0.02, "startup_first_epoch": 4.0, "startup_end_to_end": 8.0, "ml20m_epoch": 1.0,
               "sweep_speedup": 10.0,  # issue 18
               "l1_epoch": 0.03, "netflix_train": 120.0, "netflix_gib": 40.0, "lowrank20m_step": 0.2}  # issue 28
L1_MECHANISMS = ("dpsgd", "dpsgd_l1")  # the provable clipped-Laplace mechanism: per-user L1 norms (issue 28, 2)


GPU_STAGES = ("gemm", "mechanisms", "parity", "startup", "sweep", "profile", "ml20m", "netflix", "lowrank20m")  # experiments/benchmarks/gpu_bench.py's stages


def merge_gpu_rerun(base: dict, rerun: dict) -> dict:
    """``base`` with the stages that ``rerun`` (``GPU_CHECK_STAGES=... gpu_check.sh``) measured replaced.

    Only a rerun on the same GPU model is laid over the first run; anything else is an error.
    """
    if rerun.get("env", {}).get("device") != base.get("env", {}).get("device") or rerun.get("dry_run") != base.get("dry_run"):
        raise SystemExit(f"gpu-check-rerun.json ({rerun.get('env', {}).get('device')}) was not measured on the GPU of "
                         f"gpu-check.json ({base.get('env', {}).get('device')}); remove one of them")
    out = {**base, "skipped": dict(base.get("skipped") or {})}
    redone = [st for st in GPU_STAGES if st in rerun]
    for st in redone:
        out[st] = rerun[st]
        out["skipped"].pop(st, None)
    if (rerun.get("gpu_tests") or {}).get("exit_code") not in (None, "skipped"):
        out["gpu_tests"] = rerun["gpu_tests"]  # the later tests ran the later code
        redone.append("gpu tests")
    out["rerun"] = {"stages": redone, "date": rerun.get("env", {}).get("date")}
    return out


#: where a batched group's time goes, by the profile's function names (cumulative seconds, whole sweep)
PROFILE_PARTS = {
    "checkpoint writes (`io.atomic_torch_save`, in the writer thread)": "io.py:", "training steps (`Trainer._step`)": "trainer.py:",
    "Hydra composing each job's config (`load_configuration`)": "config_loader_impl.py:", "TensorBoard writers closing": "writer.py:",
    "evaluation (`score_predictor`)": "cross_validate.py:",
}
PROFILE_FN = {"io.py:": "atomic_torch_save", "trainer.py:": "_step", "config_loader_impl.py:": "load_configuration",
              "writer.py:": "close", "cross_validate.py:": "score_predictor"}


def profile_table(prof: dict) -> list[str]:
    """The batched sweep's profile (``gpu_bench.py`` stage ``profile``) as a few named parts of its wall time."""
    if not prof or "top_cumulative" not in prof:
        return []
    lines = ["", f"Where a batched group's time goes (`python -m cProfile {prof['command']}`, {prof['wall_seconds']:.1f} s "
             "wall for 7 jobs; cumulative seconds, so the parts overlap):", "", "| part | seconds |", "|---|---|"]
    for label, fname in PROFILE_PARTS.items():
        hits = [r for r in prof["top_cumulative"] if r["fn"].startswith(fname) and f"({PROFILE_FN[fname]})" in r["fn"]]
        if hits:
            lines.append(f"| {label} | {max(h['cum_s'] for h in hits):.2f} |")
    return lines


def _gib(row: dict) -> str:
    return f"{row['gpu_peak_gib']:.2f} GiB" if row.get("gpu_peak_gib") is not None else "–"


def steady_epoch(row: dict) -> float:
    """s/epoch after the first epoch where the run had more than one, else the mean."""
    later = row.get("seconds_per_epoch_after_first")
    return float(later) if later is not None else float(row["seconds_per_epoch"])


def _mechanism(row: dict) -> str:
    return row.get("mechanism") or next((o.split("=", 1)[1] for o in row.get("overrides", []) if o.startswith("mechanism=")), "?")


def _label(row: dict) -> str:
    extra = " (`model.formulation=sparse_pair`)" if "model.formulation=sparse_pair" in row.get("overrides", []) else ""
    return f"PNBM `{_mechanism(row)}`{extra}"


def gpu_tables(data: dict | None) -> str:
    """Issue 18's GPU table and its targets from ``gpu-check.json``; without it, a plain "pending" statement."""
    if data is None:
        return ("**Pending: no GPU lent.** No session has yet been lent a GPU for this check. On a GPU machine, "
                "`bash experiments/benchmarks/gpu_check.sh` (after `experiments/benchmarks/prepare_gpu_pylibs.sh`) writes "
                "`docs/results/benchmarks/gpu-check.json`; `python experiments/benchmarks/publish.py` then rewrites this block with "
                "the measured rows and the targets' verdicts.\n\n"
                "| target (issue 18) | figure | verdict |\n|---|---|---|\n"
                f"| ML-1M: every PNBM mechanism ≤ {GPU_TARGETS['ml1m_epoch']} s/epoch, CPU RMSE | – | pending: no GPU lent |\n"
                f"| start-up ≤ {GPU_TARGETS['startup_first_epoch']:g} s to the first epoch, "
                f"≤ {GPU_TARGETS['startup_end_to_end']:g} s end to end | – | pending: no GPU lent |\n"
                f"| ML-20M-size ≤ {GPU_TARGETS['ml20m_epoch']:g} s/epoch | – | pending: no GPU lent |\n"
                f"| batched sweep ≥ {GPU_TARGETS['sweep_speedup']:g}× one process per job (ML-1M, one GPU) | – | pending: no GPU lent |")
    env = data.get("env", {})
    head = (f"Measured by `experiments/benchmarks/gpu_check.sh` on {env.get('device', '?')} ({env.get('gpu_memory_gib', '?')} GiB), "
            f"torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, {env.get('date', '?')}; "
            f"TF32 matmul {'on' if env.get('tf32_matmul') else 'off'}. GPU peak = `torch.cuda.max_memory_allocated`.")
    if data.get("rerun"):
        head += f" Stages {', '.join(data['rerun']['stages'])} rerun on the same GPU model, {data['rerun']['date']}."
    if data.get("dry_run"):
        head = "**DRY RUN (CPU, tiny synthetic data): a check of the plumbing, not a measurement.** " + head
    lines = [head, "", "Every ML-1M row runs 3 epochs (its RMSE is that run's, not the mechanism's default-epochs figure); "
             "s/epoch is the mean of epochs 2-3, the first epoch of a process (kernel loading, caches) beside it.", "",
             "| run | s/epoch | first epoch | test RMSE | GPU peak | process wall |", "|---|---|---|---|---|---|"]
    rows = list(data.get("mechanisms", []))
    if data.get("ml20m"):
        rows.append({**data["ml20m"], "label": "ML-20M-size synthetic, " + _label(data["ml20m"])})
    if data.get("lowrank20m"):
        rows.append({**data["lowrank20m"], "label": "ML-20M-size synthetic, low-rank PNBM `sgld` (full batch: a step an epoch)"})
    if data.get("netflix"):
        rows.append({**data["netflix"], "label": "Netflix-size synthetic (480,189 × 17,770, 100 M), PNBM `sgld_paper`, 20 epochs"})
    for r in rows:
        label = r.get("label") or "ML-1M " + _label(r)
        if "error" in r:
            tail = " / ".join(r.get("log_tail", [])[-2:])
            lines.append(f"| {label} | failed: {(r['error'] + ('; last logged: ' + tail if tail else ''))[:300].replace('|', '/')} "
                         "| | | | |")
            continue
        n = int(r.get("epochs") or 1)
        first = r["seconds_per_epoch"] * n - steady_epoch(r) * (n - 1)
        lines.append(f"| {label} | {steady_epoch(r):.3f} | {first:.3f} | {r['test_rmse']:.4f} | {_gib(r)} | "
                     f"{r.get('process_wall', float('nan')):.1f} s |")
    gm = data.get("gemm") or {}
    if "gemm_ms_float32" in gm:
        lines += ["", f"History block × S on {gm['device']} ({gm['rows']} × {gm['items']}, {100 * gm['density']:.1f} % dense), "
                  "ms a call — the measurement behind `models.batching.dense_gemm_wins`:", "",
                  "| dtype | cuSPARSE csrmm | dense GEMM |", "|---|---|---|"]
        lines += [f"| {t} | {gm[f'csrmm_ms_{t}']:.2f} | {gm[f'gemm_ms_{t}']:.2f} |" for t in ("float32", "float64")]
    lines += profile_table(data.get("profile") or {})
    lines += ["", "| target (issue 18) | figure | verdict |", "|---|---|---|"]
    # the target is the mechanisms at their default formulation; the sparse_pair variant is shown above, not judged
    judged = [r for r in data.get("mechanisms", []) if "model.formulation=sparse_pair" not in r.get("overrides", [])]
    ok = [r for r in judged if "error" not in r]
    if ok:
        worst = max(ok, key=steady_epoch)
        met = len(ok) == len(judged) and steady_epoch(worst) <= GPU_TARGETS["ml1m_epoch"]
        lines.append(f"| ML-1M: every PNBM mechanism ≤ {GPU_TARGETS['ml1m_epoch']} s/epoch (epochs 2-3) | slowest {_label(worst)} "
                     f"{steady_epoch(worst):.3f} s ({len(ok)}/{len(judged)} ran) | {yes(met)} |")
    l1 = [r for r in judged if _mechanism(r) in L1_MECHANISMS]
    if l1:
        bad = [r for r in l1 if "error" in r]
        worst = max((r for r in l1 if "error" not in r), key=steady_epoch, default=None)
        figure = (f"{_label(worst)} {steady_epoch(worst):.3f} s" if worst else "") + (f"; {len(bad)} failed" if bad else "")
        met = not bad and worst is not None and steady_epoch(worst) <= GPU_TARGETS["l1_epoch"]
        lines.append(f"| ML-1M `dpsgd`/`dpsgd_l1` (fused per-user L1 norms, issue 28) ≤ {GPU_TARGETS['l1_epoch']} s/epoch | "
                     f"{figure} | {yes(met)} |")
    par = data.get("parity", {})
    if "abs_diff" in par:
        tol = data.get("parity_tolerance", 1e-4)
        lines.append(f"| ML-1M `mechanism=none`: GPU RMSE = CPU RMSE within {tol:g} | abs. Δ = {par['abs_diff']:.1e} | "
                     f"{yes(par['abs_diff'] <= tol)} |")
    st = data.get("startup") or {}
    if st.get("to_first_epoch") is not None:
        lines.append(f"| start-up ≤ {GPU_TARGETS['startup_first_epoch']:g} s to the first epoch (`{st['command']}`) | "
                     f"{st['to_first_epoch']:.1f} s | {yes(st['to_first_epoch'] <= GPU_TARGETS['startup_first_epoch'])} |")
        lines.append(f"| start-up ≤ {GPU_TARGETS['startup_end_to_end']:g} s end to end (same command) | {st['end_to_end']:.1f} s | "
                     f"{yes(st['end_to_end'] <= GPU_TARGETS['startup_end_to_end'])} |")
    big = data.get("ml20m") or {}
    if "seconds_per_epoch" in big:
        lines.append(f"| ML-20M-size ≤ {GPU_TARGETS['ml20m_epoch']:g} s/epoch | {steady_epoch(big):.2f} s, {_gib(big)} | "
                     f"{yes(steady_epoch(big) <= GPU_TARGETS['ml20m_epoch'])} |")
    sw = data.get("sweep") or {}
    if "modes" in sw:
        m = sw["modes"]
        sp = m["batched"]["speedup_vs_separate"]
        walls = ", ".join(f"{k} {v['wall_seconds']:.0f} s" for k, v in m.items())
        ran = sw.get("separate_jobs_run")
        if ran and ran < sw["n_jobs"]:
            walls = (f"one process per job {m['separate']['seconds_per_job']:.1f} s a job (measured on {ran} of the jobs), "
                     + ", ".join(f"{k} {v['wall_seconds']:.0f} s" for k, v in m.items() if k != "separate") + "; jobs/s ratio")
        lines.append(f"| batched sweep ≥ {GPU_TARGETS['sweep_speedup']:g}× one process per job ({sw['n_jobs']} jobs: "
                     f"{' '.join(sw['sweep'])}) | {walls}: {sp:.1f}× | {yes(sp >= GPU_TARGETS['sweep_speedup'])} |")
        if any(o.startswith("noise_seed=") for o in sw.get("fixed", [])):
            lines.append(f"| batched sweep: the numbers of separate runs | per-job metrics "
                         f"{'identical' if sw['same_numbers'] else 'DIFFER'} | {yes(bool(sw['same_numbers']))} |")
        else:  # measured before bench_sweep pinned the noise: each run drew its own secret noise
            lines.append("| batched sweep: the numbers of separate runs | not comparable in this run: noise_seed was not "
                         "pinned, so each run drew its noise from its own secret seed (bench_sweep pins it since; "
                         "the CPU sweeps below compare with it pinned) | not checked on the GPU |")
    elif "error" in sw:
        lines.append(f"| batched sweep | failed: {sw['error'][:160]} | **not met** |")
    tests = data.get("gpu_tests")
    if tests and tests.get("exit_code") != "skipped":
        chosen = tests.get("selection") or "tests"
        lines.append(f"| `pytest -m gpu {chosen}` passes | exit code {tests['exit_code']} | {yes(bool(tests.get('passed')))} |")
    for stage, why in (data.get("skipped") or {}).items():
        lines.append(f"| {stage} | not measured: {why} | not yet measured |")
    lines += _issue28_rows(data)
    return "\n".join(lines)


def _stage_row(data: dict, stage: str, target: str, judged) -> list[str]:
    """One target row for ``stage``: nothing when the stage is listed as skipped (its own row says so),
    "not in this check" when absent, a failure, or ``judged(row) -> (figure, met)``."""
    row = data.get(stage)
    if row is None:
        return [] if stage in (data.get("skipped") or {}) else [f"| {target} | not in this check | not yet measured |"]
    if "error" in row:
        return [f"| {target} | failed: {row['error'][:120]} | **not met** |"]
    figure, met = judged(row)
    return [f"| {target} | {figure} | {yes(met)} |"]


def _netflix(net: dict) -> tuple[str, bool]:
    epochs = int(net.get("epochs") or 0)
    train = float(net["seconds_per_epoch"]) * max(epochs, 1)
    met = epochs >= 20 and train <= GPU_TARGETS["netflix_train"] and (net.get("gpu_peak_gib") or 0) <= GPU_TARGETS["netflix_gib"]
    return (f"{epochs} epochs in {train:.0f} s ({steady_epoch(net):.2f} s/epoch after the first), {_gib(net)}, "
            f"process {net.get('process_wall', float('nan')):.0f} s"), met


def _issue28_rows(data: dict) -> list[str]:
    """The Netflix-size DPPS-PNBM run and the ML-20M-size low-rank step against issue 28's targets."""
    netflix = (f"Netflix-size DPPS-PNBM: 20 epochs ≤ {GPU_TARGETS['netflix_train']:g} s of training in "
               f"≤ {GPU_TARGETS['netflix_gib']:g} GiB")
    lowrank = f"low-rank PNBM at ML-20M size ≤ {GPU_TARGETS['lowrank20m_step']:g} s a step"
    return (_stage_row(data, "netflix", netflix, _netflix)
            + _stage_row(data, "lowrank20m", lowrank, lambda r: (f"{steady_epoch(r):.3f} s, {_gib(r)}",
                                                                 steady_epoch(r) <= GPU_TARGETS["lowrank20m_step"])))


SWEEP_CPU_GLOB = "sweep-cpu-*.json"  # experiments/benchmarks/bench_sweep.py on the CPU, one file per sweep
STARTUP_CPU_JSON = {"before": RESULTS / "startup-cpu-before.json", "after": RESULTS / "startup-cpu-after.json"}
# issue 28, 3: `python train.py data=ml-100k` on the CPU, before (the commit named in the file) and after
STARTUP_ML100K_JSON = {"before": RESULTS / "startup-cpu-ml100k-before.json", "after": RESULTS / "startup-cpu-ml100k-after.json"}
STARTUP_ML100K_TARGET = 3.0


def startup_ml100k(runs: dict[str, dict | None]) -> str:
    """Issue 28's CPU start-up block: the before/after table and the <= 3 s verdict on the 'after' run."""
    after = runs.get("after")
    if after is None:
        return ("Not measured yet: `OMP_NUM_THREADS=2 python experiments/benchmarks/bench_startup.py --repeat 5 "
                "--out docs/results/benchmarks/startup-cpu-ml100k-after.json -- data=ml-100k`.")
    first = after["to_first_epoch"]
    cpu = after.get("cpu_to_first_epoch")
    verdict = yes(first is not None and first <= STARTUP_ML100K_TARGET)
    return (startup_table(runs) + "\n\n| target (issue 28) | figure | verdict |\n|---|---|---|\n"
            f"| `python train.py data=ml-100k` on the CPU: ≤ {STARTUP_ML100K_TARGET:g} s to the first epoch (warm caches) | "
            f"{'–' if first is None else f'{first:.2f} s'} wall"
            + ("" if cpu is None else f", {cpu:.2f} s CPU") + f" | {verdict} |")


def sweep_table(data: dict | None) -> str:
    """One sweep three ways (``experiments/benchmarks/bench_sweep.py``): wall time, ratio to one process per job, same numbers."""
    if data is None:
        return "Not measured yet: `python experiments/benchmarks/bench_sweep.py --out docs/results/benchmarks/sweep-cpu-ml100k.json` writes it."
    lines = [f"`{' '.join(data['sweep'])}` with `{' '.join(data['fixed'])}` ({data['n_jobs']} jobs; 1-minute load "
             f"average {data['load_avg']:.1f} at the end, on a machine shared with other jobs; modes run in the order listed):", "",
             "| launcher | wall | speed-up vs one process per job |", "|---|---|---|"]
    names = {"separate": "one `python train.py` per job", "basic": "`-m` (Hydra's basic launcher)",
             "batched": "`-m hydra/launcher=batched`"}
    for mode, r in data["modes"].items():
        sp = r.get("speedup_vs_separate")
        lines.append(f"| {names.get(mode, mode)} | {r['wall_seconds']:.1f} s | {'–' if sp is None else f'{sp:.2f}×'} |")
    lines += ["", f"Per-job test RMSE, MAE and per-epoch history identical across the modes: "
                  f"**{'yes' if data['same_numbers'] else 'NO'}**."]
    return "\n".join(lines)


def startup_table(runs: dict[str, dict | None]) -> str:
    """``experiments/benchmarks/bench_startup.py`` before/after: seconds to the first epoch, end to end, slowest imports."""
    have = {k: v for k, v in runs.items() if v is not None}
    if not have:
        return "Not measured yet: `python experiments/benchmarks/bench_startup.py --out docs/results/benchmarks/startup-cpu-after.json`."
    cmd = next(iter(have.values()))["command"]
    lines = [f"`{cmd}` (minimum over runs; 1-minute load average at the end in brackets):", "",
             "| checkout | to the first epoch | end to end | CPU time | top-level imports ≥ 50 ms (`-X importtime`, s) |",
             "|---|---|---|---|---|"]
    for name, r in have.items():
        imps = ", ".join(f"`{k}` {v:.2f}" for k, v in sorted(r["imports"].items(), key=lambda kv: -kv[1])) if r.get("imports") else "–"
        first = "–" if r["to_first_epoch"] is None else f"{r['to_first_epoch']:.1f} s"
        cpu = f"{r['cpu_seconds']:.1f} s" if r.get("cpu_seconds") is not None else "–"
        lines.append(f"| {name} ({r['load_avg']:.1f}) | {first} | {r['end_to_end']:.1f} s | {cpu} | {imps} |")
    return "\n".join(lines)


def _json_or_none(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


# ---------------------------------------------------------------- speed targets (the current speed issue)
#: the JSON file behind each group of rows (under docs/results/benchmarks/), and the exact command that writes it;
#: docs/performance.md lists the same commands above its ``speed-targets`` block (a test keeps the two the same)
SPEED_JSON = {"startup-cpu": "startup-cpu-ml100k-sgld.json", "startup-gpu": "startup-gpu-ml100k-sgld.json",
              "startup-gpu-bytecode": "startup-gpu-ml100k-sgld-bytecode.json",
              "lowrank-cpu": "lowrank-cpu.json", "lowrank-gpu": "lowrank-gpu.json",
              "ml1m-t2": "bench-cpu-ml1m-t2.json", "gpu": "gpu-check.json", "gpu-mechanisms": "gpu-mechanisms.json",
              "designcard-cpu": "designcard-cpu-ml1m-sgld.json", "designcard-gpu": "designcard-gpu-ml1m-sgld.json"}
SPEED_COMMANDS = {
    "startup-cpu": "DPREC_DATA=../shared/data OMP_NUM_THREADS=2 python experiments/benchmarks/bench_startup.py --repeat 5 "
                   "--out docs/results/benchmarks/startup-cpu-ml100k-sgld.json -- mechanism=sgld epsilon=20 data=ml-100k device=cpu",
    "lowrank-cpu": "DPREC_DATA=../shared/data OMP_NUM_THREADS=2 python experiments/benchmarks/bench_pnbm_lowrank.py "
                   "--rows ml1m-400 --device cpu --repeat 5 --out docs/results/benchmarks/lowrank-cpu.json",
    "ml1m-t2": "DPREC_DATA=../shared/data python experiments/benchmarks/bench.py --threads 2 --epochs 3 --repeat 2 --tag cpu-ml1m-t2 "
               "--cases pnbm-none-ml1m-sparse pnbm-none-ml1m-dense pnbm-dpsgd-ml1m-sparse pnbm-dpsgd-ml1m-dense "
               "pnbm-sgld-ml1m-sparse pnbm-sgld-ml1m-dense",
    "startup-gpu": "python experiments/benchmarks/bench_startup.py --repeat 3 "
                   "--out docs/results/benchmarks/startup-gpu-ml100k-sgld.json -- mechanism=sgld epsilon=20 data=ml-100k device=cuda",
    "startup-gpu-bytecode": "python experiments/benchmarks/bench_startup.py --repeat 3 --bytecode-cache /tmp/dprec-pyc "
                            "--out docs/results/benchmarks/startup-gpu-ml100k-sgld-bytecode.json "
                            "-- mechanism=sgld epsilon=20 data=ml-100k device=cuda",
    "lowrank-gpu": "python experiments/benchmarks/bench_pnbm_lowrank.py --rows ml1m-400 --device cuda --repeat 2 "
                   "--out docs/results/benchmarks/lowrank-gpu.json",
    "gpu": "bash experiments/benchmarks/gpu_check.sh",
    "gpu-mechanisms": "python experiments/benchmarks/gpu_bench.py --budget 100 --stages mechanisms "
                      "--out docs/results/benchmarks/gpu-mechanisms.json",
    "designcard-cpu": "DPREC_DATA=../shared/data OMP_NUM_THREADS=2 python experiments/benchmarks/bench_startup.py --repeat 3 "
                      "--out docs/results/benchmarks/designcard-cpu-ml1m-sgld.json -- mechanism=sgld epsilon=20 data=ml-1m",
    "designcard-gpu": "python experiments/benchmarks/bench_startup.py --repeat 2 "
                      "--out docs/results/benchmarks/designcard-gpu-ml1m-sgld.json -- mechanism=sgld epsilon=20 data=ml-1m",
}
SPEED_TARGETS = {"startup_ratio": 2.0, "startup_gpu_s": 5.0, "lowrank_cpu_step_s": 0.015, "lowrank_cpu_total_s": 8.0,
                 "lowrank_gpu_step_s": 0.001, "lowrank_gpu_total_s": 1.0, "epoch_ratio": CPU_EPOCH_TARGET,
                 "epoch_goal": CPU_EPOCH_GOAL, "gaussian_gpu_epoch_s": 0.03, "designcard_cpu_s": 60.0,
                 "designcard_gpu_s": 15.0}
STARTUP_COMMAND = ("mechanism=sgld", "epsilon=20")  # `python train.py mechanism=sgld epsilon=20` (ML-100K is the default data)
NOT_MEASURED = "not measured"
LOWRANK_STEPS = 402  # bench_pnbm_lowrank.py's ml1m-400 row: 134 epochs of round(1/q) = 3 steps at q = 0.3


def _speed_row(what: str, target: str, figure: str, verdict: str) -> str:
    return f"| {what} | {target} | {figure} | {verdict} |"


def _missing(key: str, why: str = "") -> tuple[str, str]:
    return (f"{why or 'no `docs/results/benchmarks/' + SPEED_JSON[key] + '`'}: `{SPEED_COMMANDS[key]}` writes it", NOT_MEASURED)


def _on_h200(verdict: str, machine: str) -> str:
    """The GPU targets name the H200: a verdict reached on another GPU says so."""
    return verdict if "H200" in machine else f"{verdict} (on another GPU than the target's H200)"


def _code(record: dict) -> str:
    """"; code <commit>" where the benchmark recorded the commit it ran (``bench.code_version``), else nothing."""
    return f"; code {record['code']}" if record.get("code") else ""


def _startup_row(data: dict | None, key: str, device: str) -> tuple[str, str]:
    """Figure and verdict of `python train.py mechanism=sgld epsilon=20` on ML-100K (``bench_startup.py``'s JSON)."""
    if data is None:
        return _missing(key)
    words = data.get("command", "").split()
    # exactly the target's command (ML-100K is the default data; the device is named): no extra override
    if words[:2] != ["python", "train.py"] or set(words[2:]) - {"data=ml-100k"} != {*STARTUP_COMMAND, f"device={device}"}:
        return _missing(key, f"`{SPEED_JSON[key]}` is of `{data.get('command')}`, not this command")
    torch_s = data.get("import_torch")
    if torch_s is None:
        return _missing(key, f"`{SPEED_JSON[key]}` has no `import torch` time (an older bench_startup.py)")
    e2e, ratio = data["end_to_end"], data["end_to_end"] / torch_s
    n = len(data.get("runs") or [])
    if n < 2:  # the first run warms the caches: the target is a later run's
        return _missing(key, f"`{SPEED_JSON[key]}` has {n} run (no run with warm caches)")
    machine = data.get("machine") or "machine not recorded"
    threads = f"OMP_NUM_THREADS={data['omp_num_threads']}, " if data.get("omp_num_threads") else ""
    figure = (f"{e2e:.2f} s end to end vs {torch_s:.2f} s for `import torch` in the same run = {ratio:.2f}× "
              f"(minimum of {n} runs, the first warms the caches; {threads}1-min load {data.get('load_avg', float('nan')):.1f}; "
              f"{machine}{_code(data)})")
    if device == "cpu":
        return figure, yes(ratio <= SPEED_TARGETS["startup_ratio"])
    return figure, _on_h200(yes(e2e <= SPEED_TARGETS["startup_gpu_s"]), machine)


def _gpu_startup_rows(image: dict | None, bytecode: dict | None) -> tuple[str, str]:
    """The GPU start-up row: judged on the run whose bytecode was cached (``--bytecode-cache``: a warm cache, as an
    install that keeps its ``__pycache__`` has), with the run on the image as it is beside it (the lent image turns
    bytecode writing off and ships torch without it: every process compiles torch again). One file alone is judged."""
    if bytecode is None:
        return _startup_row(image, "startup-gpu", "cuda")
    figure, verdict = _startup_row(bytecode, "startup-gpu-bytecode", "cuda")
    if verdict == NOT_MEASURED:
        return figure, verdict
    plain = (_startup_row(image, "startup-gpu", "cuda")[0] if image is not None
             else f"not measured (`{SPEED_COMMANDS['startup-gpu']}`)")
    return (f"with torch's bytecode cached (`--bytecode-cache`; the image sets PYTHONDONTWRITEBYTECODE="
            f"{bytecode.get('env_dont_write_bytecode')} and ships no `__pycache__`): {figure}. On the image as it is, "
            f"every process compiling torch's sources: {plain}", verdict)


def _designcard_row(data: dict | None, key: str, device: str, limit_s: float) -> tuple[str, str]:
    """Figure and verdict of the design card on ML-1M as typed, `python train.py mechanism=sgld epsilon=20 data=ml-1m`
    (device=auto: the GPU where there is one), end to end with warm caches (``bench_startup.py``'s JSON)."""
    if data is None:
        return _missing(key)
    if data.get("command", "").split() != ["python", "train.py", *STARTUP_COMMAND, "data=ml-1m"]:
        return _missing(key, f"`{SPEED_JSON[key]}` is of `{data.get('command')}`, not this command")
    n = len(data.get("runs") or [])
    if n < 2:
        return _missing(key, f"`{SPEED_JSON[key]}` has {n} run (no run with warm caches)")
    machine = data.get("machine") or "machine not recorded"
    if (device == "cuda") != (", GPU " in machine):  # bench.machine() names the GPU that device=auto used
        return _missing(key, f"`{SPEED_JSON[key]}` was measured on {machine}, not on the {device}")
    threads = f"OMP_NUM_THREADS={data['omp_num_threads']}, " if data.get("omp_num_threads") else ""
    figure = (f"{data['end_to_end']:.2f} s end to end, {data['to_first_epoch']:.2f} s to the first epoch (minimum of {n} "
              f"runs, the first warms the caches; {threads}1-min load {data.get('load_avg', float('nan')):.1f}; {machine}"
              f"{_code(data)})")
    verdict = yes(data["end_to_end"] <= limit_s)
    return figure, (verdict if device == "cpu" else _on_h200(verdict, machine))


def _lowrank_row(rows: list[dict] | None, key: str, device: str, step_s: float, total_s: float) -> tuple[str, str]:
    """Figure and verdict of ``bench_pnbm_lowrank.py --rows ml1m-400`` (its JSON lines: the last ml1m-400 row)."""
    if rows is None:
        return _missing(key)
    mine = [r for r in rows if r.get("row") == "ml1m-400" and r.get("device_type", device) == device]
    if not mine:
        return _missing(key, f"`{SPEED_JSON[key]}` has no ml1m-400 row on `{device}`")
    r = mine[-1]
    if r.get("steps") != LOWRANK_STEPS:
        return _missing(key, f"the last ml1m-400 row of `{SPEED_JSON[key]}` ran {r.get('steps')} steps, not {LOWRANK_STEPS}")
    machine = r.get("machine") or f"{r.get('device', '?')} (machine line not recorded)"
    step, total = r["s_per_step"], r["setup_plus_steps_s"]
    ok_step, ok_total = step <= step_s, total <= total_s
    load = f", 1-min load {r['load_avg']:.1f}" if r.get("load_avg") is not None else ""
    figure = (f"{1e3 * step:.2f} ms a step ({'met' if ok_step else 'not met'}), {total:.2f} s with set-up "
              f"({'met' if ok_total else 'not met'}: set-up {r['setup_s_incl_calibration']:.2f} s + {r['steps']} steps "
              f"{r['steps_s']:.2f} s; reading the data {r['load_s']:.2f} s apart); {r.get('threads', '?')} threads{load}; {machine}"
              f"{_code(r)}")
    if r.get("runs"):  # --repeat: the median run, beside every run's figures
        runs = ", ".join(f"{1e3 * a:.2f} ms / {b:.2f} s" for a, b in r["runs"])
        figure = f"median of {len(r['runs'])} runs, each in a fresh process ({runs}): " + figure
    verdict = yes(ok_step and ok_total)
    return figure, (verdict if device == "cpu" else _on_h200(verdict, machine))


def _epoch_row(record: dict | None, case: str) -> tuple[str, str]:
    """Figure and verdict of one ML-1M mechanism's full-S epoch against the dense epoch of the same ``bench.py`` run."""
    if record is None:
        return _missing("ml1m-t2")
    runs = {r["case"]: r for r in record["rows"]}
    s, d = runs.get(f"pnbm-{case}-ml1m-sparse"), runs.get(f"pnbm-{case}-ml1m-dense")
    if not (s and d):
        return _missing("ml1m-t2", f"`{SPEED_JSON['ml1m-t2']}` has no `pnbm-{case}-ml1m-sparse`/`-dense` pair")
    threads = {s.get("threads"), d.get("threads")}
    ratio = d["seconds_per_epoch"] / s["seconds_per_epoch"]
    load = record.get("load_average") or []
    load_s = f"; 1-min load {load[0]:.1f} before, {load[-1]:.1f} after" if load else ""
    goal = SPEED_TARGETS["epoch_goal"]
    figure = (f"{s['seconds_per_epoch']:.3f} s vs the dense reference's {d['seconds_per_epoch']:.2f} s in the same run = "
              f"{ratio:.1f}×{f' (goal {goal:g}×: met)' if ratio >= goal else ''}; "
              f"{'/'.join(str(t) for t in sorted(threads, key=str))} threads{load_s}; {record.get('machine', 'machine not recorded')}")
    if threads != {2}:
        return figure + " (not 2 threads)", NOT_MEASURED
    return figure, yes(ratio >= SPEED_TARGETS["epoch_ratio"])


def _gaussian_gpu_row(gpu: dict | None) -> tuple[str, str]:
    """Full-S `gaussian` (its PNBM form) on ML-1M from the ``mechanisms`` stage of ``gpu-mechanisms.json`` (that stage
    alone), else of ``gpu-check.json``."""
    if gpu is None:
        return _missing("gpu-mechanisms")
    env = gpu.get("env", {})
    if gpu.get("dry_run"):
        return _missing("gpu", f"`{SPEED_JSON['gpu']}` is a --dry-run (CPU, tiny data)")
    rows = [r for r in gpu.get("mechanisms", []) if "model=pnbm" in r.get("overrides", [])
            and "model.formulation=sparse_pair" not in r.get("overrides", [])
            and _mechanism(r) in ("gaussian", "gaussian_pnbm")]
    if not rows:
        return _missing("gpu", f"`{SPEED_JSON['gpu']}` has no full-S `gaussian` row")
    r = rows[-1]
    where = f"{env.get('device', '?')}, torch {env.get('torch', '?')}, {env.get('date', '?')}"
    if "error" in r:
        return f"failed: {r['error'][:120]} ({where})", yes(False)
    t = steady_epoch(r)
    which = "after the first epoch" if r.get("seconds_per_epoch_after_first") is not None else "mean over the epochs"
    return (f"{t:.3f} s/epoch ({which}, `{_mechanism(r)}`, {int(r.get('epochs') or 1)} epochs run; {where})",
            yes(t <= SPEED_TARGETS["gaussian_gpu_epoch_s"]))


def _json_lines(path: Path) -> list[dict] | None:
    """A file of JSON lines (``bench_pnbm_lowrank.py --out``) or one JSON document (a row or a list of rows)."""
    if not path.exists():
        return None
    text = path.read_text().strip()
    try:
        one = json.loads(text) if text else []
        return one if isinstance(one, list) else [one]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_gpu_check(path: Path) -> dict | None:
    """``gpu-check.json`` with a ``gpu-check-rerun.json`` beside it laid over (``merge_gpu_rerun``); None without it."""
    gpu = _json_or_none(path)
    rerun = path.with_name("gpu-check-rerun.json")
    if gpu is not None and rerun.exists():
        gpu = merge_gpu_rerun(gpu, json.loads(rerun.read_text()))
    return gpu


def speed_targets(results: Path = RESULTS, gpu_json: Path | None = None) -> str:
    """The current speed issue's targets table (what | target | figure | verdict) from the JSON files in ``results``.

    A missing file makes its rows "not measured", naming the command that writes it; numbers come only from the files.
    """
    paths = {k: results / v for k, v in SPEED_JSON.items()}
    gpu = load_gpu_check(gpu_json or paths["gpu"])
    mech_gpu = _json_or_none(paths["gpu-mechanisms"]) or gpu
    t2 = _json_or_none(paths["ml1m-t2"])
    cmd = "`python train.py mechanism=sgld epsilon=20` on ML-100K, end to end, caches warm"
    rows = [
        (f"{cmd}, CPU", f"≤ {SPEED_TARGETS['startup_ratio']:g} × `python -c \"import torch\"` of the same run",
         _startup_row(_json_or_none(paths["startup-cpu"]), "startup-cpu", "cpu")),
        (f"{cmd}, one GPU (H200)", f"≤ {SPEED_TARGETS['startup_gpu_s']:g} s",
         _gpu_startup_rows(_json_or_none(paths["startup-gpu"]), _json_or_none(paths["startup-gpu-bytecode"]))),
        ("low-rank PNBM, ML-1M fold 1, 402 steps at q = 0.3, CPU",
         f"≤ {1e3 * SPEED_TARGETS['lowrank_cpu_step_s']:g} ms a step; ≤ {SPEED_TARGETS['lowrank_cpu_total_s']:g} s with set-up",
         _lowrank_row(_json_lines(paths["lowrank-cpu"]), "lowrank-cpu", "cpu",
                      SPEED_TARGETS["lowrank_cpu_step_s"], SPEED_TARGETS["lowrank_cpu_total_s"])),
        ("the same on the H200",
         f"≤ {1e3 * SPEED_TARGETS['lowrank_gpu_step_s']:g} ms a step; ≤ {SPEED_TARGETS['lowrank_gpu_total_s']:g} s with set-up",
         _lowrank_row(_json_lines(paths["lowrank-gpu"]), "lowrank-gpu", "cuda",
                      SPEED_TARGETS["lowrank_gpu_step_s"], SPEED_TARGETS["lowrank_gpu_total_s"])),
        ("full-S `dpsgd_paper` epoch vs the dense reference, ML-1M, 2 threads",
         f"≥ {SPEED_TARGETS['epoch_ratio']:g}× (goal {SPEED_TARGETS['epoch_goal']:g}×)", _epoch_row(t2, "dpsgd")),
        ("full-S `none` epoch vs the dense reference, ML-1M, 2 threads", f"≥ {SPEED_TARGETS['epoch_ratio']:g}×",
         _epoch_row(t2, "none")),
        ("full-S `gaussian` on a GPU, ML-1M", f"≤ {SPEED_TARGETS['gaussian_gpu_epoch_s']:g} s/epoch",
         _gaussian_gpu_row(mech_gpu)),
        ("the design card on ML-1M, `python train.py mechanism=sgld epsilon=20 data=ml-1m`, caches warm, CPU",
         f"≤ {SPEED_TARGETS['designcard_cpu_s']:g} s end to end",
         _designcard_row(_json_or_none(paths["designcard-cpu"]), "designcard-cpu", "cpu", SPEED_TARGETS["designcard_cpu_s"])),
        ("the same on one GPU (H200)", f"≤ {SPEED_TARGETS['designcard_gpu_s']:g} s end to end",
         _designcard_row(_json_or_none(paths["designcard-gpu"]), "designcard-gpu", "cuda", SPEED_TARGETS["designcard_gpu_s"])),
    ]
    return "\n".join(["| what | target | figure | verdict |", "|---|---|---|---|"]
                     + [_speed_row(what, target, *judged) for what, target, judged in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--main", default="cpu-main-t1")
    ap.add_argument("--t2", default="cpu-syn1m-t2")
    ap.add_argument("--scaling", default="cpu-scaling-t1")
    ap.add_argument("--parity", nargs="*", default=["cpu-parity-none", "cpu-parity-dpsgd"])
    ap.add_argument("--repeated", default="cpu-dpsgd-syn1m-t1", help="the target's two cases run alone (optional)")
    ap.add_argument("--ml1m-t2", default="cpu-ml1m-t2", help="issue 28's CPU rows: real ML-1M, 2 threads, beside the dense epoch")
    ap.add_argument("--gpu", type=Path, default=GPU_JSON, help="gpu_check.sh's JSON; absent = the GPU rows are pending")
    ap.add_argument("--only", choices=["speed-targets"],
                    help="rewrite only this block (it needs none of the other blocks' files; a missing file is a 'not measured' row)")
    args = ap.parse_args()
    doc = ROOT / "docs" / "performance.md"
    if args.only == "speed-targets":
        splice(doc, "speed-targets", speed_targets(RESULTS, args.gpu))
        return
    repeated = cases(args.repeated) if (RESULTS / f"bench-{args.repeated}.json").exists() else None
    table = targets(cases(args.main), cases(args.t2), [cases(t) for t in args.parity], repeated)
    splice(doc, "main", read(args.main, "md"))
    splice(doc, "t2", read(args.t2, "md") + ("" if repeated is None else "\n" + read(args.repeated, "md")))
    splice(doc, "parity", "\n".join(read(t, "md") for t in args.parity))
    splice(doc, "scaling", read(args.scaling, "md"))
    splice(doc, "targets", table)
    if (RESULTS / f"bench-{args.ml1m_t2}.json").exists():
        splice(doc, "ml1m-t2", read(args.ml1m_t2, "md") + "\n" + cpu_epoch_targets(cases(args.ml1m_t2)))
    gpu = load_gpu_check(args.gpu)
    if gpu is not None and gpu.get("dry_run"):
        raise SystemExit(f"{args.gpu} is a --dry-run (CPU, tiny data); it is not published as GPU figures")
    splice(doc, "gpu", gpu_tables(gpu))
    sweeps = [json.loads(f.read_text()) for f in sorted(RESULTS.glob(SWEEP_CPU_GLOB))]
    splice(doc, "sweep-cpu", "\n\n".join(sweep_table(d) for d in sweeps) if sweeps else sweep_table(None))
    splice(doc, "startup-cpu", startup_table({k: _json_or_none(v) for k, v in STARTUP_CPU_JSON.items()}))
    splice(doc, "startup-ml100k", startup_ml100k({k: _json_or_none(v) for k, v in STARTUP_ML100K_JSON.items()}))
    splice(doc, "speed-targets", speed_targets(RESULTS, args.gpu))


if __name__ == "__main__":
    main()
