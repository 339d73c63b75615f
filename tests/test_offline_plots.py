"""The offline page of `dvc plots show`: the pinned scripts are those DVC's renderer loads, an
archive that does not match its registry digest is refused, and the page keeps DVC's slots."""

from __future__ import annotations

import base64
import hashlib

import pytest
from dvc_render.html import HTML

from dpclip.errors import DpclipError
from dpclip.reporting.offline_plots import SCRIPTS, check_versions, dvc_versions, page, verified


def test_the_pinned_versions_are_those_dvc_loads():
    assert dvc_versions() == {"vega": "5.20.2", "vega-lite": "5.2.0", "vega-embed": "6.18.2"}
    check_versions()
    assert set(SCRIPTS) == set(dvc_versions())


def test_an_archive_must_match_its_registry_digest():
    data = b"vega archive"
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    assert verified(data, integrity) == data
    with pytest.raises(DpclipError, match="does not match"):
        verified(data + b"!", integrity)


def test_the_page_has_dvc_slots_and_inline_scripts_only():
    html = page({"vega": "var a = '</script>';", "vega-lite": "var b;", "vega-embed": "var c;"})
    assert "{plot_divs}" in html and "{scripts}" not in html  # no CDN tags slot
    assert "<\\/script>" in html and html.count("</script>") == 3  # the text cannot close a tag
    filled = HTML(html).with_scripts("<script src='https://cdn'></script>") \
        .with_element("<div id='plot'></div>").embed()  # what DVC does with it
    assert "<div id='plot'></div>" in filled and "https://cdn" not in filled
