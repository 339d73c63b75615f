"""A griffe extension for the API pages (mkdocs.yml): dpclip's docstrings use Sphinx roles
(:func:`name`, :mod:`dpclip.x`, ...), which Markdown would print as they are. This turns each
into inline code, `name`, before mkdocstrings renders the docstring. Not part of the package."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|obj|exc):`~?([^`]+)`")


class RstRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
