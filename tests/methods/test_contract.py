"""Every registered method against the contract of :mod:`contract`: the method list comes
from the registry, so a new method module is covered without editing this file."""

from __future__ import annotations

import pytest
from contract import (DEVICES, check_adversarial_records, check_clip_bound, check_declaration, check_determinism,
                      check_empty_batch, check_matched_budget, check_option_validation,
                      check_resume, check_step_metrics, check_tuning_space)

from dpclip.methods import available_methods

METHODS = available_methods()


@pytest.mark.parametrize("name", METHODS)
def test_declaration(name):
    check_declaration(name)


@pytest.mark.parametrize("name", METHODS)
def test_clip_bound(name):
    check_clip_bound(name)


@pytest.mark.parametrize("name", METHODS)
def test_matched_budget(name):
    check_matched_budget(name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", METHODS)
def test_empty_batch(name, device):
    check_empty_batch(name, device)


@pytest.mark.parametrize("name", METHODS)
def test_determinism(name):
    check_determinism(name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", METHODS)
def test_resume(name, device, monkeypatch, tmp_path):
    check_resume(name, monkeypatch, tmp_path, device)


@pytest.mark.parametrize("name", METHODS)
def test_option_validation(name, tiny_raw):
    check_option_validation(name, tiny_raw)


@pytest.mark.parametrize("name", METHODS)
def test_step_metrics(name):
    check_step_metrics(name)


@pytest.mark.parametrize("name", METHODS)
def test_tuning_space(name, tiny_raw):
    check_tuning_space(name, tiny_raw)


@pytest.mark.parametrize("name", METHODS)
def test_adversarial_records(name):
    check_adversarial_records(name)
