"""Atomic writes: a failed write leaves the old file (and no temp file) behind."""

from __future__ import annotations

import json

import pytest
import torch

from dprec_torch.io import atomic_open, atomic_torch_save, atomic_write_json


def test_torch_save_round_trips_and_streams_into_the_file(tmp_path):
    path = tmp_path / "ck" / "checkpoint.pt"
    state = {"S": torch.arange(12.0).reshape(3, 4), "step": 3}
    atomic_torch_save(path, state)
    back = torch.load(path)
    assert torch.equal(back["S"], state["S"]) and back["step"] == 3
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]


def test_a_failed_save_keeps_the_previous_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "checkpoint.pt"
    atomic_torch_save(path, {"step": 1})
    with pytest.raises(Exception):
        atomic_torch_save(path, {"step": 2, "bad": lambda: None})  # lambdas do not pickle: fails mid-write
    assert torch.load(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    with pytest.raises(RuntimeError), atomic_open(path) as fh:
        fh.write(b"half")
        raise RuntimeError("killed")
    assert torch.load(path) == {"step": 1}


def test_json_writes_inf_and_nan_as_strings(tmp_path):
    atomic_write_json(tmp_path / "m.json", {"eps": float("inf"), "x": [float("nan"), 1.0]})
    assert json.loads((tmp_path / "m.json").read_text()) == {"eps": "inf", "x": ["nan", 1.0]}
