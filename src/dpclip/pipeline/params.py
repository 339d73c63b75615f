"""``params.yaml`` read and validated whole: the schema (:mod:`dpclip.config`, which knows no
plugin), then each plugin family's sections at its own registry, so a bad value fails the same
way whichever front door started the run, before any work, with one message listing every bad
key; unknown keys are refused. Which registry checks which section, and why the ``dpclip``
command loads this module by name: docs/api/pipeline.md.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from dpclip import attacks, methods
from dpclip.config import Params, with_overrides
from dpclip.data import sources
from dpclip.errors import ConfigError, DpclipError, bad_value
from dpclip.param_types import problems_of


def parse_params(raw: dict | None) -> Params:
    """Validate a raw parameter mapping; raise :class:`ConfigError` listing every bad key."""
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError([bad_value("params.yaml", raw, "must be a mapping of sections "
                                                         "(data:, train:, ...)")])
    raw = dict(raw or {})
    methods_raw = raw.pop("methods", None)
    problems: list[str] = []
    data_problems: list[str] = []
    if isinstance(raw.get("data"), dict):
        raw["data"], data_problems = sources.read_sections(raw["data"])
        problems += data_problems
    if isinstance(raw.get("attack"), dict) or raw.get("attack") is None:
        raw["attack"], attack_problems = attacks.read_sections(raw.get("attack"))
        problems += attack_problems
    try:
        params = Params.model_validate(raw)
    except ValidationError as exc:
        # as each section's own validators did: a family's checks of a section that is valid
        # on its own still run (every problem at once); methods' options need the model's
        # layers, so with an invalid schema only their names are checked
        problems += problems_of(exc, model=Params)
        valid = _valid_sections(raw)
        if "data" in valid and not data_problems:
            problems += sources.params_problems(valid["data"])
        if "attack" in valid:
            problems += attacks.params_problems(valid["attack"])
        names = (raw.get("train") or {}).get("methods") if isinstance(raw.get("train"), dict) \
            else None
        if isinstance(names, list):
            problems += methods.unknown_names([n for n in names if isinstance(n, str)])
        raise ConfigError(list(dict.fromkeys(problems)))
    if not data_problems:  # a source whose options failed has none to check against
        problems += sources.params_problems(params.data)
    problems += attacks.params_problems(params.attack)
    if params.tune.shared and "dp_sgd" not in params.train.methods:
        problems.append(bad_value("tune.shared", True, f"gives every method dp_sgd's learning "
                                  f"rate and C, but train.methods {params.train.methods} has "
                                  f"no dp_sgd"))
    options, method_problems = methods.read_params(methods_raw, params)
    problems += method_problems + _run_kind_problems(params) + _device_problems(params)
    if problems:  # a shared old section is read by several methods: its problems once
        raise ConfigError(list(dict.fromkeys(problems)))
    return params.model_copy(update={"methods": options})


def _valid_sections(raw: dict) -> dict:
    """The sections of ``raw`` that are valid on their own (name -> model): what the families
    check when the whole mapping is not valid."""
    sections = {}
    for name, field in Params.model_fields.items():
        try:
            sections[name] = field.annotation.model_validate(raw.get(name) or {})
        except (ValidationError, AttributeError):  # invalid (listed already), or no model
            pass
    return sections


def load_params(path: str | Path = "params.yaml", overrides: dict | None = None) -> Params:
    """Read ``params.yaml``, set the ``overrides`` (nested sections, e.g. ``{"train":
    {"methods": [...]}}``: what a Prefect run form changes) and validate the result."""
    path = Path(path)
    if not path.exists():
        raise DpclipError(f"parameter file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DpclipError(f"parameter file {str(path)!r} is not valid YAML: {exc}") from exc
    if overrides and isinstance(raw, dict):
        raw = with_overrides(raw, overrides)
    return parse_params(raw)


def _run_kind_problems(params: Params) -> list[str]:
    """A configured method whose ``run_kind`` names no run kind (a plugin's misspelling),
    refused when the parameters are read rather than when the run trains."""
    from dpclip.train.runs import RUN_KINDS

    kinds = {name: methods.get_method(name).run_kind for name in params.train.methods
             if name in methods.available_methods()}
    return [bad_value("train.methods", name, f"names a method whose run_kind {kind!r} is not "
                                             f"one of {RUN_KINDS.names()} (dpclip.train.runs)")
            for name, kind in kinds.items() if kind not in RUN_KINDS]


def _device_problems(params: Params) -> list[str]:
    """``train.device: cuda`` on a machine without a GPU, refused when the parameters are read
    (every stage's command reads them first), not only once a run trains."""
    if params.train.device != "cuda":
        return []
    import torch

    if torch.cuda.is_available():
        return []
    return [bad_value("train.device", "cuda", "asks for a CUDA GPU and this machine has none: "
                                              "use auto (a GPU when there is one) or cpu")]


def json_schema() -> dict:
    """The JSON schema of params.yaml, each registered method's and attack's options included
    (``methods.<name>``, ``attack.<name>``) and the registered sources as ``data.dataset``'s
    choices."""
    schema = Params.model_json_schema()
    data = schema["$defs"]["DataParams"]["properties"]
    data["dataset"] = {**data["dataset"], "enum": sources.available_sources()}
    data["shadow_dataset"]["anyOf"][0]["enum"] = sources.available_sources()
    data.pop("options")  # written as each source's own data.<key>
    for name in sources.available_sources():
        own = sources.get_source(name).Options.model_json_schema()
        schema["$defs"].update(own.pop("$defs", {}))
        data.update(own.get("properties", {}))
    attack = schema["$defs"]["AttackParams"]["properties"]
    attack.pop("options")  # written as attack.<name> sections
    attack.update({name: attacks.get_attack(name).Options.model_json_schema()
                   for name in attacks.available_attacks()})
    schema["properties"]["methods"] = {
        "type": "object", "additionalProperties": False,
        "properties": {name: methods.get_method(name).options_model().model_json_schema()
                       for name in methods.available_methods()}}
    return schema
