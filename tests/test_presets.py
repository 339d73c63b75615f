"""Paper presets: the overlays merge over params.yaml, dataset paths resolve against the
datasets folder, every committed preset validates, and a preset runs the whole pipeline into
its own folder (digits, tiny) without touching the project's outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import tiny_project_params
from dpclip.cli import main
from dpclip.config import parse_params
from dpclip.errors import DpclipError
from dpclip.io import read_json
from dpclip.presets import available_presets, load_preset, variant_params

PROJECT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", available_presets(PROJECT / "presets"))
def test_every_committed_preset_is_valid_and_reads_the_shared_datasets(name, tmp_path):
    preset = load_preset(name, PROJECT / "presets")
    assert preset["deviations"] and preset["source"]
    for variant in (preset.get("variants") or {"main": {}}):
        raw = variant_params(preset, variant, PROJECT / "params.yaml", tmp_path / "sets")
        params = parse_params(raw)  # validated as params.yaml is
        assert params.data.path.startswith(str(tmp_path / "sets"))
        assert len(params.train.seeds) >= 3  # the minimum for evidence
        assert not params.data.download  # the real files, never fetched


def test_a_variant_overlays_the_preset_and_an_unknown_one_is_refused(tmp_path):
    preset = load_preset("table11", PROJECT / "presets")
    raw = variant_params(preset, "C0.25", PROJECT / "params.yaml", tmp_path)
    assert raw["train"]["clip_norm"] == 0.25 and raw["train"]["model"] == "cnn"
    with pytest.raises(DpclipError, match="'C3' is not one of"):
        variant_params(preset, "C3", PROJECT / "params.yaml", tmp_path)
    with pytest.raises(DpclipError, match="does not exist"):
        load_preset("table99", PROJECT / "presets")
    # LiRA and RMIA in a preset: at least 8 reference models, or none
    weak = {**preset, "params": {**preset["params"], "attack": {"references": 2}}}
    with pytest.raises(DpclipError, match="attack.references: 2 is too few for evidence"):
        variant_params(weak, "C1", PROJECT / "params.yaml", tmp_path)
    strong = {**preset, "params": {**preset["params"], "attack": {"references": 8}}}
    assert variant_params(strong, "C1", PROJECT / "params.yaml", tmp_path)["attack"][
        "references"] == 8


def test_a_preset_runs_the_pipeline_in_its_own_folder(tmp_path, capsys):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_project_params()))
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny.yaml").write_text(yaml.safe_dump({
        "description": "d", "source": "s", "deviations": ["digits, not MNIST"],
        "params": {"train": {"methods": ["dp_sgd"], "seeds": [0, 1], "epochs": 1},
                   "attack": {"references": 0}, "audit": {"kinds": []},
                   "evaluate": {"ir_attack": False}, "shadow": {"epochs": 1}},
        "variants": {"C1": {"train": {"clip_norm": 1.0}}, "C2": {"train": {"clip_norm": 2.0}}}}))
    assert main(["--root", str(tmp_path), "--quiet", "preset", "tiny", "--variant", "C2"]) == 0
    out = tmp_path / "results" / "presets" / "tiny"
    record = read_json(out / "preset.json")
    assert list(record["variants"]) == ["C2"] and record["deviations"] == ["digits, not MNIST"]
    assert (out / "C2" / "reports" / "comparison.csv").is_file()
    assert read_json(out / "C2" / "runs" / "dp_sgd-eps8-iid-seed1" / "record.json")
    assert yaml.safe_load((out / "C2" / "params.yaml").read_text())["train"]["clip_norm"] == 2.0
    assert not (tmp_path / "runs").exists()  # the project's own outputs untouched
    assert "tiny C2:" in capsys.readouterr().out
