"""The benchmark tooling: which cases run where the data is missing, and the derived targets table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"))

import bench  # noqa: E402
import publish  # noqa: E402


def epoch_row(case: str, seconds: float, rmse: float, rss: float = 900.0, **extra) -> dict:
    kind, mech, data, impl = bench.parse(case)
    kind = "pnbmtopk" if kind.startswith("pnbmtopk") else kind  # as run_case records it (k in sparse_k)
    return {"case": case, "kind": kind, "mechanism": mech, "data": data, "impl": impl,
            "seconds_per_epoch": seconds, "test_rmse": rmse, "peak_rss_mb": rss, "epochs": 1, **extra}


def runs(*rows: dict) -> dict[str, dict]:
    return {r["case"]: r for r in rows}


def verdict(table: str, starts: str) -> str:
    line = next(l for l in table.splitlines() if l.startswith(starts))
    return line.rsplit("|", 2)[-2].strip()


def test_speed_target_is_a_ratio_of_the_same_run() -> None:
    fast = runs(epoch_row("pnbm-dpsgd-syn1m-sparse", 1.0, 0.95), epoch_row("pnbm-dpsgd-syn1m-dense", 10.5, 0.95))
    slow = runs(epoch_row("pnbm-dpsgd-syn1m-sparse", 1.0, 0.95), epoch_row("pnbm-dpsgd-syn1m-dense", 9.9, 0.95 + 0.003))
    assert verdict(publish.targets(fast, None, []), "| ML-1M-size DPSGD") == "**met**"
    table = publish.targets(slow, None, [])
    assert verdict(table, "| ML-1M-size DPSGD") == "**not met**"
    assert verdict(table, "| ML-1M-size: test RMSE") == "**not met**"  # |Δ| = 0.003 > 0.002


def test_topk_rows_distinguish_worse_from_better() -> None:
    dense = epoch_row("pnbm-none-syn1m-sparse", 1.0, 0.80, rss=1000)
    parity = runs(dense,
                  epoch_row("pnbmtopk200-none-syn1m-sparse", 1.0, 0.79, rss=700, sparse_k=200),    # better by 0.01
                  epoch_row("pnbmtopk500-none-syn1m-sparse", 1.0, 0.806, rss=800, sparse_k=500),   # worse by 0.006
                  epoch_row("pnbmtopk1000-none-syn1m-sparse", 1.0, 0.803, rss=900, sparse_k=1000),  # within
                  epoch_row("pnbmtopk2000-none-syn1m-sparse", 1.0, 0.80, rss=1100, sparse_k=2000))  # over memory
    table = publish.targets({}, None, [parity])
    assert "better by 0.0100" in verdict(table, "| top-k S (syn1m, none, k = 200,")
    assert verdict(table, "| top-k S (syn1m, none, k = 500,") == "**not met**"
    assert verdict(table, "| top-k S (syn1m, none, k = 1000,") == "**met**"
    assert verdict(table, "| top-k S (syn1m, none, k = 2000,") == "**not met**"


def test_real_ml1m_rows_or_a_plain_statement_that_they_are_missing() -> None:
    without = publish.targets(runs(epoch_row("pnbm-dpsgd-syn1m-sparse", 1, 0.9)), None, [])
    assert verdict(without, "| the same targets on real ML-1M") == "not yet measured"
    with_ml1m = publish.targets(runs(epoch_row("pnbm-dpsgd-ml1m-sparse", 1.0, 0.9), epoch_row("pnbm-dpsgd-ml1m-dense", 12.0, 0.9)),
                                None, [])
    assert verdict(with_ml1m, "| ML-1M DPSGD") == "**met**"
    assert "the same targets on real ML-1M" not in with_ml1m


def test_ml1m_cases_run_only_where_the_data_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "data_path", lambda key: tmp_path / "cache" / f"{key}.pt")  # no prepared copy
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("DPREC_DATA", str(tmp_path / "data"))
    assert "pnbm-dpsgd-ml1m-dense" in bench.cases_in("main")
    assert not bench.available("ml1m")
    assert bench.available("syn1m")  # generated, never missing
    (tmp_path / "data" / "ml-1m").mkdir(parents=True)
    (tmp_path / "data" / "ml-1m" / "ratings.dat").write_text("1::1::5::978300760\n")
    assert bench.available("ml1m")


def test_a_separate_repeated_run_is_shown_beside_the_main_run_not_instead() -> None:
    main = runs(epoch_row("pnbm-dpsgd-syn1m-sparse", 1.4, 0.95), epoch_row("pnbm-dpsgd-syn1m-dense", 13.7, 0.95))
    repeated = runs(epoch_row("pnbm-dpsgd-syn1m-sparse", 1.1, 0.95, runs=4), epoch_row("pnbm-dpsgd-syn1m-dense", 13.5, 0.95, runs=4))
    table = publish.targets(main, None, [], repeated)
    assert verdict(table, "| ML-1M-size DPSGD-PNBM full-batch epoch ≥ 10× the dense epoch (1 thread) |") == "**not met**"
    assert verdict(table, "| ML-1M-size DPSGD-PNBM full-batch epoch ≥ 10× the dense epoch (1 thread, separate run of "
                          "these two cases, 4 repeats) |") == "**met**"


def test_issue_28_cpu_rows_judge_each_mechanism_against_its_dense_epoch() -> None:
    runs = {r["case"]: {**r, "threads": 2} for r in (
        epoch_row("pnbm-none-ml1m-sparse", 0.3, 0.866), epoch_row("pnbm-none-ml1m-dense", 6.3, 0.866),
        epoch_row("pnbm-dpsgd-ml1m-sparse", 0.5, 0.92), epoch_row("pnbm-dpsgd-ml1m-dense", 4.0, 0.92),
        epoch_row("pnbm-sgld-ml1m-sparse", 0.2, 0.93), epoch_row("pnbm-sgld-ml1m-dense", 4.0, 0.931))}
    table = publish.cpu_epoch_targets(runs)
    assert verdict(table, "| ML-1M `none` full-batch epoch") == "**met**" and "21.0× (goal 20×: met)" in table
    assert verdict(table, "| ML-1M `dpsgd_paper` full-batch epoch") == "**not met**"  # 8x
    assert verdict(table, "| ML-1M `sgld_paper`: the same test RMSE") == "**not met**"
    assert verdict(publish.cpu_epoch_targets({}), "| ML-1M `none` epoch") == "not yet measured"


# -------------------------------------------------------------------------- GPU check, sweeps, start-up
import bench_startup  # noqa: E402
import bench_sweep  # noqa: E402
import gpu_bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def gpu_row(mech: str, seconds: float, rmse: float = 0.87, **extra) -> dict:
    return {"overrides": ["data=ml-1m", "device=cuda", f"mechanism={mech}"], "mechanism": mech, "seconds_per_epoch": seconds,
            "test_rmse": rmse, "gpu_peak_gib": 0.8, "process_wall": 9.0, **extra}


def gpu_check(**over) -> dict:
    data = {"dry_run": False, "env": {"device": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.2, "torch": "2.11", "cuda": "12.8"},
            "parity_tolerance": 1e-4, "skipped": {},
            "mechanisms": [gpu_row("none", 0.012), gpu_row("dpsgd_paper", 0.018)],
            "parity": {"abs_diff": 3e-6},
            "startup": {"command": "python train.py data=ml-1m device=cuda", "to_first_epoch": 3.5, "end_to_end": 7.9},
            "ml20m": gpu_row("dpsgd_paper", 0.9, overrides=["data=synthetic", "data.preset=ml-20m"]),
            "sweep": {"sweep": ["epsilon=0.1,0.5"], "fixed": ["data=ml-1m", "noise_seed=0"], "n_jobs": 7, "same_numbers": True,
                      "modes": {"separate": {"wall_seconds": 80.0, "speedup_vs_separate": 1.0},
                                "batched": {"wall_seconds": 7.0, "speedup_vs_separate": 80 / 7}}},
            "gpu_tests": {"exit_code": "0", "passed": True}}
    data.update(over)
    return data


def test_gpu_block_says_pending_without_a_gpu_check() -> None:
    table = publish.gpu_tables(None)
    assert table.startswith("**Pending: no GPU lent.**")
    rows = [l for l in table.splitlines() if l.startswith("| ") and not l.startswith("| target")]
    assert len(rows) == 4 and all(verdict(table, r[:25]) == "pending: no GPU lent" for r in rows)


def test_gpu_block_verdicts_follow_the_measured_figures() -> None:
    table = publish.gpu_tables(gpu_check())
    assert "NVIDIA H100" in table and "DRY RUN" not in table
    assert verdict(table, "| ML-1M: every PNBM mechanism") == "**met**"
    assert verdict(table, "| ML-1M `mechanism=none`: GPU RMSE = CPU RMSE") == "**met**"
    assert verdict(table, "| start-up ≤ 4 s to the first epoch") == "**met**"
    assert verdict(table, "| start-up ≤ 8 s end to end") == "**met**"
    assert verdict(table, "| ML-20M-size ≤ 1 s/epoch") == "**met**"
    assert verdict(table, "| batched sweep ≥ 10×") == "**met**"
    assert verdict(table, "| batched sweep: the numbers of separate runs") == "**met**"
    assert verdict(table, "| `pytest -m gpu tests` passes") == "**met**"

    slow = gpu_check(mechanisms=[gpu_row("none", 0.012), gpu_row("sgld_paper", 0.03), {"overrides": ["mechanism=gaussian"], "error": "CUDA OOM"}],
                     parity={"abs_diff": 2e-4}, startup={"command": "c", "to_first_epoch": 4.2, "end_to_end": 7.0},
                     sweep={**gpu_check()["sweep"], "same_numbers": False})
    table = publish.gpu_tables(slow)
    assert verdict(table, "| ML-1M: every PNBM mechanism") == "**not met**"
    assert "slowest PNBM `sgld_paper` 0.030 s (2/3 ran)" in table
    assert "| ML-1M PNBM `gaussian` | failed: CUDA OOM |" in table
    assert verdict(table, "| ML-1M `mechanism=none`: GPU RMSE = CPU RMSE") == "**not met**"
    assert verdict(table, "| start-up ≤ 4 s to the first epoch") == "**not met**"
    assert verdict(table, "| batched sweep: the numbers of separate runs") == "**not met**"
    unpinned = gpu_check(sweep={**gpu_check()["sweep"], "fixed": ["data=ml-1m"], "same_numbers": False})
    assert verdict(publish.gpu_tables(unpinned), "| batched sweep: the numbers of separate runs") == "not checked on the GPU"


def test_gpu_block_judges_issue_28_targets() -> None:
    fast = gpu_check(mechanisms=[gpu_row("none", 0.012), gpu_row("dpsgd", 0.025), gpu_row("dpsgd_l1", 0.021)],
                     netflix=gpu_row("sgld_paper", 5.5, epochs=20, seconds_per_epoch_after_first=5.4, gpu_peak_gib=30.0),
                     lowrank20m=gpu_row("sgld", 0.15, epochs=3, seconds_per_epoch_after_first=0.12))
    table = publish.gpu_tables(fast)
    assert verdict(table, "| ML-1M `dpsgd`/`dpsgd_l1`") == "**met**"
    assert verdict(table, "| Netflix-size DPPS-PNBM") == "**met**"  # 20 x 5.5 = 110 s <= 120 s, 30 GiB
    assert verdict(table, "| low-rank PNBM at ML-20M size") == "**met**"
    slow = gpu_check(mechanisms=[gpu_row("dpsgd", 0.144), gpu_row("dpsgd_l1", 0.02)],
                     netflix={"overrides": ["data.preset=netflix"], "error": "timed out after 240 s", "log_tail": ["epoch 9"]},
                     lowrank20m=gpu_row("sgld", 0.3, epochs=3, seconds_per_epoch_after_first=0.25))
    table = publish.gpu_tables(slow)
    assert verdict(table, "| ML-1M `dpsgd`/`dpsgd_l1`") == "**not met**" and "0.144 s" in table
    assert verdict(table, "| Netflix-size DPPS-PNBM") == "**not met**" and "last logged: epoch 9" in table
    assert verdict(table, "| low-rank PNBM at ML-20M size") == "**not met**"
    heavy = gpu_check(netflix=gpu_row("sgld_paper", 5.5, epochs=20, gpu_peak_gib=41.0))
    assert verdict(publish.gpu_tables(heavy), "| Netflix-size DPPS-PNBM") == "**not met**"  # over 40 GiB


def test_gpu_block_names_skipped_stages_and_dry_runs() -> None:
    table = publish.gpu_tables(gpu_check(dry_run=True, skipped={"ml20m": "out of budget: 20 s left"}, ml20m=None))
    assert table.startswith("**DRY RUN")
    assert verdict(table, "| ml20m | not measured: out of budget") == "not yet measured"
    assert "| ML-20M-size ≤ 1 s/epoch" not in table


def test_a_rerun_replaces_only_its_stages_and_only_on_the_same_gpu() -> None:
    base = gpu_check(skipped={"ml20m": "out of budget"}, ml20m=None)
    rerun = {"dry_run": False, "env": {**base["env"], "date": "later"}, "skipped": {}, "ml20m": gpu_row("dpsgd_paper", 0.7)}
    merged = publish.merge_gpu_rerun(base, rerun)
    assert merged["ml20m"]["seconds_per_epoch"] == 0.7 and merged["skipped"] == {}
    assert merged["mechanisms"] == base["mechanisms"] and merged["rerun"] == {"stages": ["ml20m"], "date": "later"}
    assert verdict(publish.gpu_tables(merged), "| ML-20M-size ≤ 1 s/epoch") == "**met**"
    with pytest.raises(SystemExit, match="not measured on the GPU"):
        publish.merge_gpu_rerun(base, {**rerun, "env": {"device": "NVIDIA H200"}})


def test_gpu_bench_plans_every_pnbm_mechanism_and_no_output_mechanism() -> None:
    real, dry = gpu_bench.plan(dry=False), gpu_bench.plan(dry=True)
    mechs = {o.split("=", 1)[1] for case in real["mechanisms"] for o in case if o.startswith("mechanism=")}
    on_disk = {p.stem for p in (ROOT / "conf" / "mechanism").glob("*.yaml")}
    assert "none" in mechs and mechs <= on_disk
    assert not mechs & {"laplace_output", "exponential_topk", "builtin"}  # they wrap fitted predictors
    assert all("device=cuda" in c and "data=ml-1m" in c for c in real["mechanisms"])
    assert all("device=cpu" in c and "data=synthetic" in c for c in dry["mechanisms"])
    assert "data.preset=netflix" in real["netflix"] and "mechanism.epochs=20" in real["netflix"]
    assert "model=pnbm_lowrank" in real["lowrank20m"] and "data.preset=ml-20m" in real["lowrank20m"]
    assert "data.preset=ml-20m" in real["ml20m"] and real["sweep"]["sweep"] == [gpu_bench.SWEEP_EPS, "seed=0,1,2"]  # the issue's sweep
    assert real["sweep"]["separate_sample"] == 3 and "hydra/launcher=batched" not in real["profile"]
    assert [c for c in real["parity"] if "device=cpu" in c] and [c for c in real["parity"] if "device=cuda" in c]


def test_sweep_jobs_expand_in_hydra_order() -> None:
    assert bench_sweep.expand(["epsilon=1,5", "seed=0,1"]) == [["epsilon=1", "seed=0"], ["epsilon=1", "seed=1"],
                                                               ["epsilon=5", "seed=0"], ["epsilon=5", "seed=1"]]


def test_startup_reads_top_level_imports() -> None:
    err = ("import time: self [us] | cumulative | imported package\nimport time:      5 |     60000 |   torch._C\n"
           "import time:     10 |   2500000 | torch._dynamo\nimport time:      3 |      4000 | json\n")
    assert bench_startup.top_imports(err) == {"torch._dynamo": 2.5}


def test_sweep_and_startup_blocks() -> None:
    sweep = {"sweep": ["epsilon=1,5"], "fixed": ["data=ml-100k"], "n_jobs": 2, "load_avg": 1.0, "same_numbers": True,
             "modes": {"separate": {"wall_seconds": 20.0, "speedup_vs_separate": 1.0}, "batched": {"wall_seconds": 8.0, "speedup_vs_separate": 2.5}}}
    table = publish.sweep_table(sweep)
    assert "| `-m hydra/launcher=batched` | 8.0 s | 2.50× |" in table and "modes: **yes**" in table
    assert "Not measured" in publish.sweep_table(None)
    run = {"command": "python train.py data=ml-1m", "to_first_epoch": 4.0, "end_to_end": 9.0, "load_avg": 2.0, "imports": {"torch._dynamo": 2.5}}
    assert "| before (2.0) | 4.0 s | 9.0 s | – | `torch._dynamo` 2.50 |" in publish.startup_table({"before": run, "after": None})


def test_prepare_gpu_pylibs_makes_hydra_importable_without_site_packages(tmp_path: Path) -> None:
    """The device image has no Hydra/OmegaConf: the copied folder alone must provide them (``python -S``)."""
    import os
    import subprocess

    proc = subprocess.run(["bash", str(ROOT / "experiments" / "benchmarks" / "prepare_gpu_pylibs.sh"), str(tmp_path)], capture_output=True,
                          text=True, env={**os.environ, "DPREC_DATA": str(tmp_path / "no-data")})
    assert proc.returncode == 0, proc.stderr
    libs = tmp_path / ".gpu_pylibs"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import hydra, omegaconf, antlr4, yaml; "
            "from hydra import compose; assert hydra.__file__.startswith(sys.argv[1])")
    check = subprocess.run([sys.executable, "-S", "-c", code, str(libs)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert (libs / "opacus" / "__init__.py").exists() and (libs / "MANIFEST.json").exists()
    assert sum(p.stat().st_size for p in libs.rglob("*") if p.is_file()) < 40 * 2**20  # carry limit: 64 MiB in all


@pytest.mark.slow
def test_gpu_check_dry_run_writes_a_publishable_json(tmp_path: Path) -> None:
    """``bash experiments/benchmarks/gpu_check.sh --dry-run``: the whole script on the CPU with tiny data, JSON -> table."""
    import json
    import os
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_BUDGET": "900", "DPREC_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(ROOT / "experiments" / "benchmarks" / "gpu_check.sh"), "--dry-run"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "gpu-check-dry.json").read_text())
    assert data["dry_run"] and data["skipped"] == {}
    assert data["mechanisms"] and all("error" not in r for r in data["mechanisms"]), data["mechanisms"]
    assert data["sweep"]["same_numbers"] and data["startup"]["to_first_epoch"] is not None
    assert "test_rmse" in data["ml20m"] and data["parity"]["abs_diff"] == 0.0  # CPU vs CPU: the same run
    assert "test_rmse" in data["netflix"] and "test_rmse" in data["lowrank20m"], (data["netflix"], data["lowrank20m"])
    assert publish.gpu_tables(data).startswith("**DRY RUN")


def test_sampled_separate_mode_picks_spread_jobs() -> None:
    assert bench_sweep.sample_indices(21, 7) == [0, 3, 7, 10, 13, 17, 20]
    assert bench_sweep.sample_indices(4, None) == [0, 1, 2, 3] and bench_sweep.sample_indices(3, 9) == [0, 1, 2]
    a = {"index": [0, 3], "jobs": [{"test_rmse": 1.0}, {"test_rmse": 2.0}]}
    b = {"index": [0, 1, 2, 3], "jobs": [{"test_rmse": 1.0}, {"test_rmse": 9.0}, {"test_rmse": 9.0}, {"test_rmse": 2.0}]}
    assert bench_sweep.same_numbers(a, b)
    b["jobs"][3]["test_rmse"] = 2.5
    assert not bench_sweep.same_numbers(a, b)


# -------------------------------------------------------------------------- speed targets (the current speed issue)
import json  # noqa: E402

STARTUP_CPU = "| `python train.py mechanism=sgld epsilon=20` on ML-100K, end to end, caches warm, CPU |"
STARTUP_GPU = "| `python train.py mechanism=sgld epsilon=20` on ML-100K, end to end, caches warm, one GPU (H200) |"
LOWRANK_CPU, LOWRANK_GPU = "| low-rank PNBM, ML-1M fold 1, 402 steps at q = 0.3, CPU |", "| the same on the H200 |"
EPOCH_DPSGD = "| full-S `dpsgd_paper` epoch vs the dense reference, ML-1M, 2 threads |"
EPOCH_NONE = "| full-S `none` epoch vs the dense reference, ML-1M, 2 threads |"
GAUSSIAN_GPU = "| full-S `gaussian` on a GPU, ML-1M |"
DESIGN_CPU = "| the design card on ML-1M, `python train.py mechanism=sgld epsilon=20 data=ml-1m`, caches warm, CPU |"
DESIGN_GPU = "| the same on one GPU (H200) |"


def designcard_json(end_to_end: float, machine: str, runs: int = 3, data: str = "ml-1m") -> dict:
    return {"command": f"python train.py mechanism=sgld epsilon=20 data={data}", "runs": [{"end_to_end": end_to_end}] * runs,
            "end_to_end": end_to_end, "to_first_epoch": end_to_end / 2, "load_avg": 0.1, "machine": machine}


def startup_json(end_to_end: float, device: str = "cpu", runs: int = 5, extra: str = "", machine: str = "Test CPU, 2 cores") -> dict:
    return {"command": f"python train.py mechanism=sgld epsilon=20 data=ml-100k device={device}{extra}",
            "runs": [{"end_to_end": end_to_end}] * runs, "end_to_end": end_to_end, "import_torch": 1.0, "load_avg": 0.1,
            "machine": machine, "omp_num_threads": "2"}


def lowrank_line(step_s: float, total_s: float, device: str = "cpu", machine: str = "Test CPU, 2 cores", steps: int = 402) -> str:
    return json.dumps({"row": "ml1m-400", "device_type": device, "machine": machine, "threads": 2, "load_s": 0.5,
                       "setup_s_incl_calibration": 0.5, "steps": steps, "steps_s": total_s - 0.5, "s_per_step": step_s,
                       "setup_plus_steps_s": total_s, "load_avg": 0.1})


def write(folder: Path, name: str, data) -> None:
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


def speed(folder: Path) -> str:
    return publish.speed_targets(folder, folder / "gpu-check.json")


def test_speed_targets_say_not_measured_and_name_the_command_without_files(tmp_path: Path) -> None:
    table = speed(tmp_path)
    for key, row in (("startup-cpu", STARTUP_CPU), ("startup-gpu", STARTUP_GPU), ("lowrank-cpu", LOWRANK_CPU),
                     ("lowrank-gpu", LOWRANK_GPU), ("ml1m-t2", EPOCH_DPSGD), ("ml1m-t2", EPOCH_NONE),
                     ("gpu-mechanisms", GAUSSIAN_GPU), ("designcard-cpu", DESIGN_CPU), ("designcard-gpu", DESIGN_GPU)):
        assert verdict(table, row) == "not measured", row
        assert publish.SPEED_COMMANDS[key] in next(line for line in table.splitlines() if line.startswith(row))


def test_speed_target_verdicts_follow_the_json_files(tmp_path: Path) -> None:
    met, miss = tmp_path / "met", tmp_path / "miss"
    met.mkdir(), miss.mkdir()
    write(met, "startup-cpu-ml100k-sgld.json", startup_json(1.9))      # 1.9 x import torch
    write(miss, "startup-cpu-ml100k-sgld.json", startup_json(2.1))
    write(met, "startup-gpu-ml100k-sgld.json", startup_json(4.5, "cuda", machine="Test CPU, GPU NVIDIA H200"))
    write(miss, "startup-gpu-ml100k-sgld.json", startup_json(5.5, "cuda", machine="Test CPU, GPU NVIDIA H200"))
    write(met, "lowrank-cpu.json", lowrank_line(0.050, 30.0) + "\n" + lowrank_line(0.014, 7.5) + "\n")  # the last line counts
    write(miss, "lowrank-cpu.json", lowrank_line(0.014, 7.5) + "\n" + lowrank_line(0.014, 8.5) + "\n")  # step met, total not
    write(met, "lowrank-gpu.json", lowrank_line(0.0009, 0.9, "cuda", "Test CPU, GPU NVIDIA H200") + "\n")
    write(miss, "lowrank-gpu.json", lowrank_line(0.0011, 0.9, "cuda", "Test CPU, GPU NVIDIA H200") + "\n")
    for folder, sparse in ((met, 0.25), (miss, 0.35)):  # dense epoch 3.0 s: 12x vs 8.6x
        rows = [epoch_row(f"pnbm-{m}-ml1m-{impl}", sparse if impl == "sparse" else 3.0, 0.9, threads=2)
                for m in ("none", "dpsgd") for impl in ("sparse", "dense")]
        write(folder, "bench-cpu-ml1m-t2.json", {"machine": "Test CPU, 2 cores", "load_average": [0.1, 0.2], "rows": rows})
    gaussian = {"overrides": ["data=ml-1m", "device=cuda", "model=pnbm", "mechanism=gaussian_pnbm"], "mechanism": "gaussian_pnbm",
                "epochs": 3, "test_rmse": 0.9}
    write(met, "gpu-check.json", gpu_check(mechanisms=[{**gaussian, "seconds_per_epoch": 0.05, "seconds_per_epoch_after_first": 0.025}]))
    write(miss, "gpu-check.json", gpu_check(mechanisms=[{**gaussian, "seconds_per_epoch": 0.05, "seconds_per_epoch_after_first": 0.035}]))
    write(met, "designcard-cpu-ml1m-sgld.json", designcard_json(59.0, "Test CPU, 2 cores"))
    write(miss, "designcard-cpu-ml1m-sgld.json", designcard_json(61.0, "Test CPU, 2 cores"))
    write(met, "designcard-gpu-ml1m-sgld.json", designcard_json(14.0, "Test CPU, GPU NVIDIA H200"))
    write(miss, "designcard-gpu-ml1m-sgld.json", designcard_json(16.0, "Test CPU, GPU NVIDIA H200"))
    good, bad = speed(met), speed(miss)
    for row in (STARTUP_CPU, STARTUP_GPU, LOWRANK_CPU, LOWRANK_GPU, EPOCH_DPSGD, EPOCH_NONE, GAUSSIAN_GPU, DESIGN_CPU,
                DESIGN_GPU):
        assert verdict(good, row).startswith("**met**"), row
        assert verdict(bad, row).startswith("**not met**"), row
    assert verdict(good, STARTUP_GPU) == "**met**"  # measured on the H200 the target names
    assert verdict(good, GAUSSIAN_GPU) == "**met**" and "NVIDIA H100 80GB HBM3" in good  # the machine is named
    assert "= 1.90×" in good and "= 12.0×" in good and "Test CPU, 2 cores" in good


def test_a_repeated_low_rank_row_is_its_median_run_with_every_run_listed(tmp_path: Path) -> None:
    """``bench_pnbm_lowrank.py --repeat``: the verdict is the median run's, and the table shows each run beside it."""
    line = json.loads(lowrank_line(0.0125, 6.5))
    line.update(repeat=3, runs=[[0.0110, 6.0], [0.0125, 6.5], [0.0170, 8.9]])
    write(tmp_path, "lowrank-cpu.json", json.dumps(line) + "\n")
    table = speed(tmp_path)
    assert verdict(table, LOWRANK_CPU).startswith("**met**")
    assert "median of 3 runs, each in a fresh process (11.00 ms / 6.00 s, 12.50 ms / 6.50 s, 17.00 ms / 8.90 s)" in table


def test_speed_targets_refuse_figures_of_another_measurement(tmp_path: Path) -> None:
    write(tmp_path, "startup-cpu-ml100k-sgld.json", startup_json(1.5, extra=" mechanism.epochs=1"))  # not the target's command
    write(tmp_path, "startup-gpu-ml100k-sgld.json", startup_json(1.5, "cuda", runs=1))  # no run with warm caches
    write(tmp_path, "lowrank-cpu.json", lowrank_line(0.001, 1.0, steps=10))
    write(tmp_path, "lowrank-gpu.json", lowrank_line(0.0005, 0.5, "cuda", "Test CPU, GPU NVIDIA H100 80GB HBM3"))
    rows = [epoch_row(f"pnbm-dpsgd-ml1m-{impl}", 0.1 if impl == "sparse" else 3.0, 0.9, threads=1) for impl in ("sparse", "dense")]
    write(tmp_path, "bench-cpu-ml1m-t2.json", {"machine": "Test CPU", "rows": rows})
    write(tmp_path, "gpu-check.json", gpu_check(dry_run=True))
    write(tmp_path, "designcard-cpu-ml1m-sgld.json", designcard_json(5.0, "Test CPU, GPU NVIDIA H200"))  # not the CPU
    write(tmp_path, "designcard-gpu-ml1m-sgld.json", designcard_json(5.0, "Test CPU, GPU NVIDIA H200", data="ml-100k"))
    table = speed(tmp_path)
    for row in (STARTUP_CPU, STARTUP_GPU, LOWRANK_CPU, EPOCH_DPSGD, EPOCH_NONE, GAUSSIAN_GPU, DESIGN_CPU, DESIGN_GPU):
        assert verdict(table, row) == "not measured", row
    assert verdict(table, LOWRANK_GPU) == "**met** (on another GPU than the target's H200)"


def test_the_gpu_start_up_row_is_judged_on_the_bytecode_cached_run_with_the_image_run_beside(tmp_path: Path) -> None:
    h200 = "Test CPU, GPU NVIDIA H200"
    write(tmp_path, "startup-gpu-ml100k-sgld.json", startup_json(7.5, "cuda", machine=h200))
    table = speed(tmp_path)
    assert verdict(table, STARTUP_GPU) == "**not met**"  # the image run alone is judged
    cached = {**startup_json(3.5, "cuda", machine=h200), "bytecode_cache": "/tmp/pyc", "env_dont_write_bytecode": "1"}
    write(tmp_path, "startup-gpu-ml100k-sgld-bytecode.json", cached)
    line = next(l for l in speed(tmp_path).splitlines() if l.startswith(STARTUP_GPU))
    assert line.rsplit("|", 2)[-2].strip() == "**met**"
    assert "3.50 s end to end" in line and "7.50 s end to end" in line and "PYTHONDONTWRITEBYTECODE=1" in line
    write(tmp_path, "startup-gpu-ml100k-sgld-bytecode.json", {**cached, "end_to_end": 5.5, "runs": [{"end_to_end": 5.5}] * 3})
    assert verdict(speed(tmp_path), STARTUP_GPU) == "**not met**"


def test_a_row_names_the_commit_its_benchmark_ran_where_recorded(tmp_path: Path) -> None:
    write(tmp_path, "lowrank-cpu.json", lowrank_line(0.01, 5.0))
    assert "; code " not in next(l for l in speed(tmp_path).splitlines() if l.startswith(LOWRANK_CPU))
    write(tmp_path, "lowrank-cpu.json", json.dumps({**json.loads(lowrank_line(0.01, 5.0)), "code": "0123456789"}))
    write(tmp_path, "startup-cpu-ml100k-sgld.json", {**startup_json(1.9), "code": "abcdef0123+changes"})
    table = speed(tmp_path)
    assert "; code 0123456789" in next(l for l in table.splitlines() if l.startswith(LOWRANK_CPU))
    assert "; code abcdef0123+changes" in next(l for l in table.splitlines() if l.startswith(STARTUP_CPU))


def test_performance_page_lists_each_speed_command_above_its_block() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    start = text.index("<!-- speed-targets:start -->")
    assert "<!-- speed-targets:end -->" in text[start:]
    for cmd in publish.SPEED_COMMANDS.values():
        assert cmd in text[:start], cmd
