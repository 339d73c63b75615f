"""Bad parameters fail before any work, with one message naming the key and the value."""

from __future__ import annotations

import pytest

from dpclip.pipeline.params import parse_params
from dpclip.run_keys import run_name
from dpclip.errors import ConfigError


@pytest.mark.parametrize("section, values, key, shown", [
    ("privacy", {"target_epsilons": [0]}, "privacy.target_epsilons", "0"),
    ("privacy", {"target_epsilons": [-1.5]}, "privacy.target_epsilons", "-1.5"),
    ("privacy", {"delta": 0}, "privacy.delta", "0"),
    ("privacy", {"delta": 1.0}, "privacy.delta", "1.0"),
    ("privacy", {"delta": "abc"}, "privacy.delta", "'abc'"),
    ("privacy", {"accountant": "gdp"}, "privacy.accountant", "'gdp'"),
    ("partition", {"alphas": [0.5, -1]}, "partition.alphas", "-1"),
    ("partition", {"alphas": [0]}, "partition.alphas", "0"),
    ("partition", {"alphas": ["skewed"]}, "partition.alphas", "'skewed'"),
    ("data", {"dataset": "imagenet"}, "data.dataset", "'imagenet'"),
    ("train", {"model": "resnet50"}, "train.model", "'resnet50'"),
    ("train", {"methods": ["dp_sgd", "magic"]}, "train.methods", "'magic'"),
    ("train", {"batch_size": "sixty"}, "train.batch_size", "'sixty'"),
    ("train", {"epochs": 0}, "train.epochs", "0"),
    ("train", {"lr": "fast"}, "train.lr", "'fast'"),
    ("train", {"device": "tpu"}, "train.device", "'tpu'"),
    ("train", {"batchsize": 32}, "train.batchsize", "32"),
    ("attack", {"references": 3}, "attack.references", "3"),
    ("attack", {"references": 2, "mode": "online"}, "attack.references", "2"),
    ("attack", {"references": 2, "lira": {"fixed_variance": False}}, "attack.references", "2"),
    ("attack", {"mode": "shadow"}, "attack.mode", "'shadow'"),
    ("attack", {"population": "holdout"}, "attack.population", "'holdout'"),
])
def test_bad_value_names_key_and_value(tiny_raw, section, values, key, shown):
    with pytest.raises(ConfigError) as info:
        parse_params(tiny_raw(**{section: values}))
    message = str(info.value)
    assert key in message and shown in message
    assert len(info.value.problems) == 1


def test_every_bad_key_is_reported_at_once(tiny_raw):
    raw = tiny_raw(privacy={"delta": 2.0, "target_epsilons": [-1]}, data={"dataset": "x"})
    with pytest.raises(ConfigError) as info:
        parse_params(raw)
    joined = "\n".join(info.value.problems)
    for key in ("privacy.delta", "privacy.target_epsilons", "data.dataset"):
        assert key in joined


def test_csv_needs_path_and_target(tiny_raw):
    with pytest.raises(ConfigError) as info:
        parse_params(tiny_raw(data={"dataset": "csv"}))
    assert "data.path" in str(info.value) and "data.target" in str(info.value)


def test_split_fractions_must_sum_to_one(tiny_raw):
    with pytest.raises(ConfigError, match="data.split"):
        parse_params(tiny_raw(data={"split": {"target_train": 0.9}}))


def test_defaults_parse_and_name_runs_like_the_contract(tiny_raw):
    params = parse_params(tiny_raw())
    assert params.privacy.accountant == "rdp"
    assert run_name("dp_sgd", params.privacy.target_epsilons[0], "iid", 0) == \
        "dp_sgd-eps8-iid-seed0"
    assert run_name("dp_sgd", 2.5, 0.1, 3) == "dp_sgd-eps2.5-0.1-seed3"


def test_dpclip_schema_describes_params_yaml_for_an_editor(tmp_path, tiny_raw):
    """``dpclip schema`` writes a JSON schema that accepts the project's params.yaml and
    refuses what the validator refuses (checked with the jsonschema package)."""
    import json

    import jsonschema
    import yaml

    from conftest import PROJECT
    from dpclip.cli import main

    out = tmp_path / "params.schema.json"
    assert main(["schema", "--out", str(out)]) == 0
    schema = json.loads(out.read_text())
    assert schema["properties"]["privacy"]["$ref"].endswith("PrivacyParams")
    delta = schema["$defs"]["PrivacyParams"]["properties"]["delta"]
    assert (delta["exclusiveMinimum"], delta["exclusiveMaximum"]) == (0, 1)
    p_rule = schema["properties"]["methods"]["properties"]["dc_sgd_p"]["properties"]["p"]
    assert (p_rule["exclusiveMinimum"], p_rule["exclusiveMaximum"]) == (0, 1)
    jsonschema.validate(yaml.safe_load((PROJECT / "params.yaml").read_text()), schema)
    for bad in ({"privacy": {"delta": 0}}, {"train": {"batchsize": 3}},
                {"methods": {"dc_sgd_p": {"p": 1.5}}}, {"methods": {"magic": {}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(tiny_raw(**bad), schema)
        with pytest.raises(ConfigError):
            parse_params(tiny_raw(**bad))


def test_an_empty_section_means_its_defaults_and_a_file_must_be_a_mapping(tiny_raw):
    raw = tiny_raw()
    raw.update(tracking=None, evaluate=None)  # "tracking:" with nothing under it
    params = parse_params(raw)
    assert params.tracking.private_diagnostics is False and params.evaluate.ece_bins == 15
    with pytest.raises(ConfigError, match=r"params.yaml: \[1, 2\] must be a mapping"):
        parse_params([1, 2])


@pytest.mark.parametrize("section, values, key, shown", [
    ("privacy", {"target_epsilons": [8, 8.0]}, "privacy.target_epsilons", "[8, 8.0]"),
    ("train", {"early_stopping": {"threshold": float("inf")}},
     "train.early_stopping.threshold", "inf"),
    ("train", {"lr": True}, "train.lr", "True"),
    ("data", {"categories": {"smoker": [True, "no"]}}, "data.categories.smoker", "True"),
    ("methods", {"ww_dp_sgd": {"probe": ""}}, "methods.ww_dp_sgd.probe", "''"),
    ("methods", {"auto_s": {"gamma": float("nan")}}, "methods.auto_s.gamma", "nan"),
])
def test_values_the_old_validator_refused_are_still_refused(tiny_raw, section, values, key,
                                                            shown):
    with pytest.raises(ConfigError) as info:
        parse_params(tiny_raw(**{section: values}))
    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith(f"{key}: {shown}")


def test_every_unknown_method_is_named(tiny_raw):
    with pytest.raises(ConfigError) as info:
        parse_params(tiny_raw(train={"methods": ["dp_sgd", "magic", "more_magic"]}))
    assert [p.split(" is not")[0] for p in info.value.problems] == [
        "train.methods: 'magic'", "train.methods: 'more_magic'"]


def test_a_gpu_that_is_not_there_is_refused_when_the_parameters_are_read(tiny_raw, monkeypatch,
                                                                          write_params):
    import subprocess
    import sys

    import torch

    has_gpu = torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"train\.device: 'cuda' asks for a CUDA GPU and this "
                                          r"machine has none"):
        parse_params(tiny_raw(train={"device": "cuda"}))
    parse_params(tiny_raw(train={"device": "auto"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parse_params(tiny_raw(train={"device": "cuda"})).train.device == "cuda"
    if not has_gpu:  # every command refuses it, before any work (here: a partition)
        path = write_params(tiny_raw(train={"device": "cuda"}))
        done = subprocess.run([sys.executable, "-m", "dpclip.cli", "--params", str(path),
                               "partition", "--alpha", "iid"], capture_output=True, text=True)
        assert done.returncode == 2 and "train.device: 'cuda'" in done.stderr


def test_an_invalid_section_still_names_unknown_methods_and_invents_no_layer_problem(tiny_raw):
    """With part of train invalid, the other problems are still listed at once (an unknown
    method with a bad learning rate), and the options of a method are not checked against a
    model the file does not ask for (conv1 is a layer of the cnn, not of the default mlp)."""
    with pytest.raises(ConfigError) as info:
        parse_params(tiny_raw(train={"lr": -1, "methods": ["dp_sgd", "nope"]}))
    joined = "\n".join(info.value.problems)
    assert "train.lr: -1" in joined and "train.methods: 'nope' is not one of" in joined
    with pytest.raises(ConfigError) as info:
        parse_params(tiny_raw(train={"model": "cnn", "lr": -1},
                              methods={"ww_dp_sgd": {"probe": "conv1"}}))
    assert info.value.problems == ["train.lr: -1 input should be greater than 0"]


def test_a_typo_in_a_key_names_the_key_it_was_meant_to_be(tiny_raw):
    raw = tiny_raw()
    raw["train"]["epoch"] = 3
    raw["privacy"]["target_epsilon"] = [1]
    raw["train"]["zzz"] = 1
    raw["attack"] = {**raw.get("attack", {}), "lira": {"fixed_varianse": True}}
    with pytest.raises(ConfigError) as caught:
        parse_params(raw)
    text = str(caught.value)
    raw = tiny_raw(methods={"dp_sdg": {}, "ww_dp_sgd": {"kapa": 0.1}})
    with pytest.raises(ConfigError) as caught:
        parse_params(raw)
    text += "\n" + str(caught.value)
    assert "methods.ww_dp_sgd.kapa: 0.1 is not a known key (did you mean 'kappa'?)" in text
    assert "train.epoch: 3 is not a known key (did you mean 'epochs'?)" in text
    assert "privacy.target_epsilon: [1] is not a known key (did you mean " \
           "'target_epsilons'?)" in text
    assert "train.zzz: 1 is not a known key\n" in text + "\n"  # nothing close: no guess
    assert "methods.dp_sdg: {} is not a known key (did you mean 'dp_sgd'?)" in text
    assert ("attack.lira.fixed_varianse: True is not a known key (did you mean "
            "'fixed_variance'?)") in text
