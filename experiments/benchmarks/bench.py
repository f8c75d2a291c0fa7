"""Speed and memory of training epochs and kNN fit+predict, each next to its reference implementation.

Every case runs in its own subprocess (so peak RSS is per case) on the same data:

* PNBM (mechanism none | dpsgd | sgld), MF (none | dpsgd): the package's full-batch epoch
  (``impl=sparse``: sparse-pair PNBM, embedding MF) next to the straightforward dense epoch of
  ``experiments/benchmarks/dense_reference.py`` (``impl=dense``), same initialisation, optimizer and noise,
  so the test RMSEs must agree to float tolerance.
* PNBM with top-k sparse S (``pnbmtopk``) next to dense-S PNBM: memory and RMSE.
* PCC/COS: ``ItemKNN`` fit+predict next to the per-rating loop of ``experiments/benchmarks/knn_loop_reference.py``
  (timed on a subsample, extrapolated per rating).
* Scaling: one DPSGD-PNBM epoch (dense S and top-k S) on synthetic data of several sizes.

Seconds per epoch are the minimum over ``--epochs`` epochs (the first also builds the pair
layout, reported as ``first_epoch_seconds``) and over ``--repeat`` interleaved runs of the
case; peak RSS is the high-water mark from after the data is loaded to the end of the case
(maximum over runs). Writes ``<out>/bench-<tag>.json`` and ``.md``.

    python experiments/benchmarks/bench.py --group main --threads 1 --repeat 2
    python experiments/benchmarks/bench.py --group scaling --threads 1 --epochs 2
    python experiments/benchmarks/bench.py --cases pnbm-dpsgd-syn1m-sparse pnbm-dpsgd-syn1m-dense
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

# data key -> (loader, kwargs); "synthetic" sizes are (n_users, n_items, n_ratings)
DATA = {
    "ml100k": ("movielens", {"name": "ml-100k"}),
    "ml1m": ("movielens", {"name": "ml-1m"}),  # real ML-1M: only where it is on disk (DPREC_DATA or the cache)
    "syn1m": ("synthetic", {"preset": "ml-1m"}),
    "syn-s": ("synthetic", {"preset": "ml-1m", "n_users": 1500, "n_items": 1000, "n_ratings": 100_000}),
    "syn-m": ("synthetic", {"preset": "ml-1m", "n_users": 3000, "n_items": 2000, "n_ratings": 300_000}),
    "syn-l": ("synthetic", {"preset": "ml-1m", "n_users": 12000, "n_items": 6000, "n_ratings": 2_000_000}),
    "syn-wide": ("synthetic", {"preset": "ml-1m", "n_users": 60000, "n_items": 3706, "n_ratings": 1_000_000}),
    "syn-20m": ("synthetic", {"preset": "ml-20m"}),  # 138,493 x 26,744, 20M ratings (dense S alone: 2.9 GB)
}
TABLE_DATA = ("ml100k", "ml1m", "syn1m")  # the data of the training and top-k tables
TOPK_K = 200  # k of the "pnbmtopk" cases; "pnbmtopk<k>" (e.g. pnbmtopk1000) sets another k


def cases_in(group: str) -> list[str]:
    out = []
    if group in ("main", "all"):
        for data in TABLE_DATA:
            for mech in ("none", "dpsgd", "sgld"):
                out += [f"pnbm-{mech}-{data}-sparse", f"pnbm-{mech}-{data}-dense"]
            for mech in ("none", "dpsgd"):
                out += [f"pnbmtopk-{mech}-{data}-sparse"] + ([f"pnbmtopk1000-{mech}-{data}-sparse"] if data != "ml100k" else [])
            if (ROOT / "dprec_torch" / "models" / "mf.py").exists():
                for mech in ("none", "dpsgd"):
                    out += [f"mf-{mech}-{data}-sparse", f"mf-{mech}-{data}-dense"]
            for sim in ("pcc", "cos"):
                out += [f"{sim}-{data}-fast", f"{sim}-{data}-loop"]
    if group.startswith("parity-"):  # top-k S vs dense S at the config's training length (none: --epochs 5, dpsgd: 1)
        mech = group.split("-", 1)[1]
        for data, ks in (("ml100k", (200, 500, 1000)), ("ml1m", (200, 500, 1000, 2000)), ("syn1m", (200, 500, 1000, 2000))):
            out += [f"pnbm-{mech}-{data}-sparse"] + [f"pnbmtopk{k}-{mech}-{data}-sparse" for k in ks]
    if group in ("scaling", "all"):
        for data in ("syn-s", "syn-m", "syn1m", "syn-l", "syn-wide", "syn-20m"):
            out += [f"pnbm-dpsgd-{data}-sparse", f"pnbmtopk-dpsgd-{data}-sparse"]
            if data in ("syn-s", "syn-m", "syn1m"):
                out += [f"pnbm-dpsgd-{data}-dense"]
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------- data cache
def data_path(key: str) -> Path:
    return Path(tempfile.gettempdir()) / "dprec-bench" / f"{key}.pt"


def prepare(key: str) -> None:
    path = data_path(key)
    if path.exists():
        return
    kind, kwargs = DATA[key]
    if kind == "movielens":
        from dprec_torch.data.movielens import load_movielens

        fold = load_movielens(kwargs["name"], fold=1).folds[0]
    else:
        from dprec_torch.data.synthetic import load_synthetic

        fold = load_synthetic(fold=1, **kwargs).folds[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fold, path)


def available(key: str) -> bool:
    """Whether ``key``'s data can be had without a download (real ML-1M is skipped where it is absent)."""
    kind, kwargs = DATA[key]
    if kind != "movielens" or data_path(key).exists():
        return True
    from dprec_torch.data.movielens import find_movielens

    return find_movielens(kwargs["name"]) is not None


def load(key: str):
    return torch.load(data_path(key), weights_only=False)


# ---------------------------------------------------------------- memory
def reset_peak_rss() -> float:
    """Reset the kernel's RSS high-water mark (Linux ``clear_refs``); returns the current RSS in MiB."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    v = _status_mb("VmHWM")
    if math.isnan(v):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return v


def _status_mb(field: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# ---------------------------------------------------------------- one case
def mechanism_kwargs(mech: str, model: str) -> tuple[type, dict]:
    """The conf/mechanism defaults (plus conf/tuned for MF), full batch (sampling_ratio = 1)."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    # the published case names predate the rename (issue 15, #9): their 'dpsgd'/'sgld' are the paper-faithful forms
    mech = {"dpsgd": "dpsgd_paper", "sgld": "sgld_paper"}.get(mech, mech)
    from hydra import compose, initialize_config_dir

    # composed as train.py composes it: conf/tuned/<mech>_<model>.yaml may point at another conf/mechanism file
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        node = compose(config_name="config", overrides=[f"mechanism={mech}", f"model={model}"]).mechanism
    data = {k: v for k, v in OmegaConf.to_container(node, resolve=False).items() if not k.startswith("_")}
    cls = get_class(node["_target_"])
    for key in ("name", "epochs"):
        data.pop(key, None)
    data.update(seed=0)
    if "epsilon" in data:
        data["epsilon"] = 1.0
    if "delta" in data:
        data["delta"] = 1e-6
    if model == "mf" and mech == "none":  # tuned for mini-batches of 2% of the ratings: same per-rating step, full batch
        data["lr"] = float(data["lr"]) * float(data.get("sampling_ratio", 1.0))
    data["sampling_ratio"] = 1.0
    # as the runner instantiates (config.accepted): a key the class does not take (MapSGD has no sampling_ratio) stays out
    params = inspect.signature(cls.__init__).parameters
    return cls, {k: v for k, v in data.items() if k in params}


def parse(name: str) -> tuple[str, str | None, str, str]:
    """'<kind>-<mechanism>-<data>-<impl>' (training) or '<pcc|cos>-<data>-<impl>' -> (kind, mechanism, data, impl)."""
    head, impl = name.rsplit("-", 1)
    kind, rest = head.split("-", 1)
    if kind in ("pcc", "cos"):
        return kind, None, rest, impl
    mech, data = rest.split("-", 1)
    return kind, mech, data, impl


def run_case(name: str, epochs: int) -> dict:
    kind, mech, data, impl = parse(name)
    fold = load(data)
    out: dict = {"case": name, "kind": kind, "data": data, "impl": impl, "threads": torch.get_num_threads(),
                 "n_users": fold.train.n_users, "n_items": fold.train.n_items, "n_ratings": len(fold.train)}
    counts = fold.train.user_counts().double()
    out["sum_sq_user_ratings"] = float((counts**2).sum())
    out["baseline_rss_mb"] = reset_peak_rss()
    if kind in ("pcc", "cos"):
        out.update(knn_case(kind, fold, impl))
    else:
        out["mechanism"] = mech
        k = TOPK_K
        if kind.startswith("pnbmtopk"):
            kind, k = "pnbmtopk", int(kind[len("pnbmtopk"):] or TOPK_K)
            out["kind"] = kind
        out.update(train_case(kind, mech, fold, impl, epochs, k))
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def train_case(kind: str, mech: str, fold, impl: str, epochs: int, topk_k: int = TOPK_K) -> dict:
    from dense_reference import DenseMFEpoch, DensePNBMEpoch

    from dprec_torch.evaluation.metrics import rmse
    from dprec_torch.mechanisms.context import TrainingContext, gradient_reduction_of, prior_precision_for
    from dprec_torch.models.batching import PoissonBatchSampler
    from dprec_torch.seeding import make_generator
    from dprec_torch.training.trainer import Trainer

    model_key = "mf" if kind == "mf" else "pnbm"
    cls, kwargs = mechanism_kwargs(mech, model_key)
    train = fold.train
    if getattr(cls, "relation", None) == "user" and kwargs.get("max_user_ratings"):
        from dprec_torch.data.preprocess import cap_user_ratings

        train, _ = cap_user_ratings(train, int(kwargs["max_user_ratings"]), make_generator(17))
    if kind == "pnbm":
        from dprec_torch.models.pnbm import PNBM

        model = PNBM(train.n_items, formulation="sparse_pair").attach(train)
    elif kind == "pnbmtopk":
        from dprec_torch.models.pnbm_topk import PNBMTopK

        model = PNBMTopK(train.n_items, sparse_k=topk_k).attach(train)
    else:
        from dprec_torch.models.mf import MF

        model = MF(train.n_users, train.n_items).attach(train)
    unit = "user" if getattr(cls, "relation", None) == "user" else "rating"
    means = model.item_means if model.centres_on_item_means else train.item_means()
    sampler = PoissonBatchSampler(train, means, 1.0, unit, make_generator(1))
    prior = prior_precision_for(cls, model, train, len(train))
    n_units = len(train) if unit == "rating" else train.n_users
    ctx = TrainingContext(total_steps=epochs, steps_per_epoch=1, n_ratings=len(train), n_users=train.n_users,
                          scale=train.scale, max_user_ratings=kwargs.get("max_user_ratings"),
                          entry_bound=model.gradient_entry_bound, prior_precision=prior, model=model,
                          n_units=n_units, expected_batch_size=n_units,  # full batch: q = 1, as the runner builds it
                          gradient_reduction=gradient_reduction_of(model))
    opt = cls(model.parameters(), ctx, **kwargs)
    opt.prepare(model)  # DP item means and the start of S, before any batch is built (as setup_training)
    dense = None
    if impl == "dense":
        dense = (DenseMFEpoch if kind == "mf" else DensePNBMEpoch)(model, train)
    trainer = Trainer(model, opt, sampler, epochs)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        if dense is None:
            trainer._step()
        else:
            dense.step(opt, sampler.sample())
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    pred = (dense or model).predict(fold.test.users, fold.test.items)
    predict_s = time.perf_counter() - t0
    res = {"seconds_per_epoch": min(times), "first_epoch_seconds": times[0], "epoch_seconds": times,
           "predict_seconds": predict_s, "test_rmse": rmse(pred, fold.test.values), "epochs": epochs}
    if kind == "pnbmtopk":
        res.update(sparse_k=topk_k, model_state_mb=model.memory_bytes() / 2**20)
    elif kind == "pnbm":
        res["model_state_mb"] = model.S.numel() * 4 / 2**20
    return res


def knn_case(kind: str, fold, impl: str) -> dict:
    import numpy as np

    from dprec_torch.evaluation.metrics import rmse
    from dprec_torch.predictors.knn import ItemKNN

    sim = "pearson" if kind == "pcc" else "cosine"
    k = 900 if fold.train.n_items < 3000 else 1300  # the paper's k for ML-100K / ML-1M
    if impl == "fast":
        t0 = time.perf_counter()
        model = ItemKNN(sim, k=k).fit(fold.train)
        t1 = time.perf_counter()
        pred = model.predict(fold.test.users, fold.test.items)
        t2 = time.perf_counter()
        return {"k": k, "fit_seconds": t1 - t0, "predict_seconds": t2 - t1, "fit_predict_seconds": t2 - t0,
                "test_rmse": rmse(pred, fold.test.values)}
    from knn_loop_reference import loop_fit, loop_predict

    rng = np.random.default_rng(0)
    tr = fold.train
    n_fit_users = max(10, tr.n_users // 100)
    fit_users = np.sort(rng.choice(tr.n_users, n_fit_users, replace=False))
    _, fit_s, visited = loop_fit(tr, sim, fit_users)
    fit_extrap = fit_s / max(visited, 1) * len(tr)
    # predict: loop over a test subsample with the exact similarity, checked against ItemKNN there
    fast = ItemKNN(sim, k=k).fit(tr)
    n_test = min(len(fold.test), 5000)
    sel = np.sort(rng.choice(len(fold.test), n_test, replace=False))
    users, items = fold.test.users.numpy()[sel], fold.test.items.numpy()[sel]
    known = fast.fallback_.known(torch.from_numpy(users), torch.from_numpy(items)).numpy()
    raw, pred_s = loop_predict(tr, fast.sim_.double().numpy(), k, users[known], items[known])
    ref = fast.predict(torch.from_numpy(users[known]), torch.from_numpy(items[known])).double().numpy()
    agree = float(np.abs(np.clip(raw, tr.scale.lo, tr.scale.hi) - ref).max()) if len(ref) else 0.0
    pred_extrap = pred_s / max(int(known.sum()), 1) * len(fold.test)
    return {"k": k, "loop_fit_seconds_measured": fit_s, "loop_fit_ratings_timed": visited,
            "fit_seconds": fit_extrap, "loop_predict_seconds_measured": pred_s, "loop_predict_ratings_timed": int(known.sum()),
            "predict_seconds": pred_extrap, "fit_predict_seconds": fit_extrap + pred_extrap,
            "extrapolated": True, "max_abs_diff_vs_fast_on_subsample": agree}


# ---------------------------------------------------------------- report
def machine(gpu: bool = False) -> str:
    """CPU model, cores, RAM, torch and Python; with ``gpu``, the name of the GPU torch sees (if any) after them."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = _status_total_gb()
    line = f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GB RAM, torch {torch.__version__}, Python {platform.python_version()}"
    return line + (f", GPU {torch.cuda.get_device_name(0)}" if gpu and torch.cuda.is_available() else "")


def code_version() -> str | None:
    """The commit the benchmark ran (``DPREC_CODE_VERSION`` where the caller names it, e.g. a copy without git history
    on a lent GPU; else ``git rev-parse``), with ``+changes`` when tracked files outside docs/ differ from it; None where
    unknown."""
    named = os.environ.get("DPREC_CODE_VERSION")
    if named:
        return named
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"], cwd=root,
                               capture_output=True, text=True, timeout=10)  # (docs/: results, not code)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _status_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def fmt(v, spec: str = ".3f") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def markdown(rows: list[dict], header: str) -> str:
    by = {r["case"]: r for r in rows}
    lines = [header, ""]
    train_rows = [r for r in rows if r["kind"] in ("pnbm", "mf") and r["impl"] == "sparse" and r["data"] in TABLE_DATA]
    if train_rows:
        lines += ["### Training epochs (full batch) vs the dense reference epoch", "",
                  "| model | mechanism | data | s/epoch (ours) | s/epoch (dense ref) | speed-up | peak RSS MB (ours) | "
                  "peak RSS MB (dense ref) | test RMSE (ours) | test RMSE (dense ref) | ΔRMSE |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in train_rows:
            d = by.get(r["case"].replace("-sparse", "-dense"), {})
            sp = d.get("seconds_per_epoch", float("nan")) / r["seconds_per_epoch"] if d else float("nan")
            dr = abs(r["test_rmse"] - d["test_rmse"]) if d else float("nan")
            lines.append(f"| {r['kind'].upper()} | {r['mechanism']} | {r['data']} | {fmt(r['seconds_per_epoch'])} | "
                         f"{fmt(d.get('seconds_per_epoch'))} | {fmt(sp, '.1f')}× | {fmt(r['peak_rss_mb'], '.0f')} | "
                         f"{fmt(d.get('peak_rss_mb'), '.0f')} | {fmt(r['test_rmse'], '.4f')} | {fmt(d.get('test_rmse'), '.4f')} | "
                         f"{fmt(dr, '.1e')} |")
        lines.append("")
    topk = [r for r in rows if r["kind"] == "pnbmtopk" and r["data"] in TABLE_DATA]
    if topk:
        lines += ["### Top-k sparse S (support = shrunk PCC, NOT private) vs dense S", "",
                  "| mechanism | data | k | S state MB (top-k / dense) | peak RSS MB (top-k / dense S) | s/epoch (top-k / dense S) | "
                  "test RMSE top-k | test RMSE dense S | ΔRMSE |", "|---|---|---|---|---|---|---|---|---|"]
        for r in topk:
            d = by.get(f"pnbm-{r['mechanism']}-{r['data']}-sparse", {})
            dr = r["test_rmse"] - d["test_rmse"] if d else float("nan")
            lines.append(f"| {r['mechanism']} | {r['data']} | {r['sparse_k']} | {fmt(r['model_state_mb'], '.1f')} / {fmt(d.get('model_state_mb'), '.1f')} | "
                         f"{fmt(r['peak_rss_mb'], '.0f')} / {fmt(d.get('peak_rss_mb'), '.0f')} | "
                         f"{fmt(r['seconds_per_epoch'])} / {fmt(d.get('seconds_per_epoch'))} | {fmt(r['test_rmse'], '.4f')} | "
                         f"{fmt(d.get('test_rmse'), '.4f')} | {fmt(dr, '+.4f')} |")
        lines.append("")
    knn = [r for r in rows if r["kind"] in ("pcc", "cos") and r["impl"] == "fast"]
    if knn:
        lines += ["### PCC / COS fit+predict vs the per-rating loop (loop timed on a subsample, extrapolated per rating)", "",
                  "| method | data | k | fit+predict s (ours) | fit s / predict s (ours) | loop fit+predict s (extrapolated) | "
                  "speed-up | peak RSS MB (ours) | test RMSE | loop vs ours max diff |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in knn:
            lp = by.get(r["case"].replace("-fast", "-loop"), {})
            sp = lp.get("fit_predict_seconds", float("nan")) / r["fit_predict_seconds"] if lp else float("nan")
            lines.append(f"| {r['kind'].upper()} | {r['data']} | {r['k']} | {fmt(r['fit_predict_seconds'])} | "
                         f"{fmt(r['fit_seconds'], '.2f')} / {fmt(r['predict_seconds'], '.2f')} | {fmt(lp.get('fit_predict_seconds'), '.1f')} | "
                         f"{fmt(sp, '.0f')}× | {fmt(r['peak_rss_mb'], '.0f')} | {fmt(r['test_rmse'], '.4f')} | "
                         f"{fmt(lp.get('max_abs_diff_vs_fast_on_subsample'), '.1e')} |")
        lines.append("")
    scale = [r for r in rows if r["kind"] in ("pnbm", "pnbmtopk") and r["mechanism"] == "dpsgd"
             and r["data"] in ("syn-s", "syn-m", "syn1m", "syn-l", "syn-wide")]
    if scale:
        lines += ["### Memory across sizes (DPSGD-PNBM, one full-batch epoch; synthetic power-law data)", "",
                  "| data | N | M | ratings | Σ_u |R_u|² | N·M | M² | M·k | dense S: s/epoch, peak RSS MB | "
                  f"top-k S (k={TOPK_K}): s/epoch, peak RSS MB | dense ref: s/epoch, peak RSS MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for data in ("syn-s", "syn-m", "syn1m", "syn-l", "syn-wide", "syn-20m"):
            s, t, d = (by.get(f"{p}-dpsgd-{data}-{i}") for p, i in (("pnbm", "sparse"), ("pnbmtopk", "sparse"), ("pnbm", "dense")))
            base = s or t
            if not base:
                continue
            n, m = base["n_users"], base["n_items"]

            def pair(r):
                return f"{fmt(r['seconds_per_epoch'], '.2f')}, {fmt(r['peak_rss_mb'], '.0f')}" if r else "not run"

            lines.append(f"| {data} | {n:,} | {m:,} | {base['n_ratings']:,} | {base['sum_sq_user_ratings'] / 1e6:.0f} M | "
                         f"{n * m / 1e6:.0f} M | {m * m / 1e6:.1f} M | {m * TOPK_K / 1e6:.2f} M | {pair(s)} | {pair(t)} | {pair(d)} |")
        lines.append("")
    return "\n".join(lines)


TIMES = ("seconds_per_epoch", "first_epoch_seconds", "predict_seconds", "fit_seconds", "fit_predict_seconds")


def merge_runs(old: dict | None, new: dict) -> dict:
    """Repeats of one case: the minimum of every time, the maximum peak RSS, all runs' epoch times kept."""
    new = dict(new, runs=1, seconds_all_runs=[new.get("seconds_per_epoch", new.get("fit_predict_seconds"))])
    if old is None:
        return new
    out = dict(old)
    for key in TIMES:
        if key in new and key in old:
            out[key] = min(old[key], new[key])
    out["peak_rss_mb"] = max(old["peak_rss_mb"], new["peak_rss_mb"])
    out["runs"] = old["runs"] + 1
    out["seconds_all_runs"] = old["seconds_all_runs"] + new["seconds_all_runs"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", default="main", choices=["main", "scaling", "parity-none", "parity-dpsgd", "all"])
    ap.add_argument("--cases", nargs="*", default=None)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1, help="run every case this many times (interleaved); report the minimum")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in every case (default: torch's)")
    ap.add_argument("--tag", default=None, help="output name: <out-dir>/bench-<tag>.json/.md")
    ap.add_argument("--out-dir", default=str(ROOT / "docs" / "results" / "benchmarks"))
    ap.add_argument("--data", nargs="*", default=None, choices=sorted(DATA),
                    help="only the group's cases on these data (e.g. --data ml1m)")
    ap.add_argument("--merge", action="store_true",
                    help="add this run's rows to an existing bench-<tag>.json/.md (same case: replaced); the other rows and "
                         "their header stay as they were, and the header names this run's command and load too")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(run_case(args.one, args.epochs)))
        return
    cases = args.cases or cases_in(args.group)
    if args.data:
        cases = [c for c in cases if parse(c)[2] in args.data]
    missing = [k for k in dict.fromkeys(parse(c)[2] for c in cases) if not available(k)]
    for key in missing:
        print(f"{key}: data not on disk (set DPREC_DATA to a folder holding {DATA[key][1]['name']}/): its rows are skipped",
              file=sys.stderr, flush=True)
    cases = [c for c in cases if parse(c)[2] not in missing]
    for key in dict.fromkeys(parse(c)[2] for c in cases):
        prepare(key)
    by_case: dict[str, dict] = {}
    load_before = os.getloadavg()[0]
    for rep in range(args.repeat):  # interleaved repeats: a load spike hits one run of a case, not all
        for case in cases:
            cmd = [sys.executable, __file__, "--one", case, "--epochs", str(args.epochs)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if proc.returncode != 0:
                print(f"{case}: failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            by_case[case] = merge_runs(by_case.get(case), row)
            print(f"{case} (run {rep + 1}/{args.repeat}): done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    rows = [by_case[c] for c in cases if c in by_case]
    mach = machine()
    tag = args.tag or f"cpu-{args.group}"
    load = (load_before, os.getloadavg()[0])
    header = (f"Machine: {mach}; torch threads per case: {args.threads or torch.get_num_threads()}; "
              f"each case run {args.repeat}x (minimum shown); 1-min load average {load[0]:.1f} before, {load[1]:.1f} after; "
              f"`python experiments/benchmarks/bench.py {' '.join(sys.argv[1:])}`")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {"machine": mach, "argv": sys.argv[1:], "load_average": load, "rows": rows}
    if args.merge and (out / f"bench-{tag}.json").exists():
        record, header = merged(out / f"bench-{tag}.json", out / f"bench-{tag}.md", record, header, args.group)
    md = markdown(record["rows"], header)
    print(md)
    (out / f"bench-{tag}.json").write_text(json.dumps(record, indent=2))
    (out / f"bench-{tag}.md").write_text(md + "\n")


def merged(json_path: Path, md_path: Path, new: dict, new_header: str, group: str) -> tuple[dict, str]:
    """``new``'s rows laid over the stored run's (same case: replaced), in the group's case order; the stored
    header is kept and this run's header follows it, so every row says which command and load measured it."""
    old = json.loads(json_path.read_text())
    by_case = {r["case"]: r for r in old["rows"]} | {r["case"]: r for r in new["rows"]}
    order = {c: i for i, c in enumerate(cases_in(group))}
    rows = sorted(by_case.values(), key=lambda r: order.get(r["case"], len(order)))
    runs = old.get("merged_runs", []) + [{"argv": new["argv"], "load_average": new["load_average"],
                                          "cases": [r["case"] for r in new["rows"]]}]
    old_header = md_path.read_text().split("\n\n", 1)[0] if md_path.exists() else ""
    data = sorted({r["data"] for r in new["rows"]})
    header = f"{old_header}\n\nRows of {', '.join(f'`{d}`' for d in data)} (merged in): {new_header}"
    return {**old, "rows": rows, "merged_runs": runs}, header


if __name__ == "__main__":
    main()
