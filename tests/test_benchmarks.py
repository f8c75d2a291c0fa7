"""The benchmark tooling: which cases run where the data is missing, and the derived targets table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

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
