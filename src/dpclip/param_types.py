"""The building blocks of the parameter models (:mod:`dpclip.config`, and each method's
options model in :mod:`dpclip.methods.base`): value types that read YAML as a user wrote it,
and the translation of pydantic's errors into one line per bad key, naming the key and the
value."""

from __future__ import annotations

import difflib
import math
import re
from typing import Annotated, Any

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      WrapValidator, model_validator)

from dpclip.errors import bad_value

IID = "iid"


def _unique_list(value) -> list:
    """A scalar where a list is expected is a list of one (``target_epsilons: 8``); a value
    may appear once."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    as_numbers = {float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
                  for v in values}  # 8 and 8.0 are the same cell
    if len(as_numbers) != len(values):
        raise ValueError(f"{values!r} has repeated values")
    return values


def _no_bool(value):
    """YAML's true / false are not numbers (pydantic would read them as 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} must be a number")
    return value


def _as_written(value, validate):
    """Validate as a float, but keep an integer as the integer it was written as."""
    checked = validate(_no_bool(value))
    return value if isinstance(value, int) and not isinstance(value, bool) else checked


def _alpha(value):
    """'iid' or a Dirichlet concentration > 0, kept as written (its text names a folder)."""
    if value == IID or (isinstance(value, (int, float)) and not isinstance(value, bool)
                        and math.isfinite(value) and value > 0):
        return value
    raise ValueError(f"{value!r} must be 'iid' or a Dirichlet concentration > 0")


NUMBER = BeforeValidator(_no_bool)
Fraction = Annotated[float, Field(ge=0, le=1), NUMBER]
Count = Annotated[int, Field(ge=1), NUMBER]  # epochs, batch sizes, bins ...
Seed = Annotated[int, Field(ge=0), NUMBER]
# a float that stays an integer when written as one: target_epsilons [8] names runs "eps8"
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False), WrapValidator(_as_written)]
Alpha = Annotated[Any, BeforeValidator(_alpha)]
Real = Annotated[float, NUMBER, Field(allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1)]


def _level(value) -> str:
    """A category level as text (YAML may read 3 or 1.5); true / false are no level."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a level (text or a number)")
    return str(value)


Level = Annotated[str, BeforeValidator(_level)]


def unique_list(item, *, min_length: int = 1):
    return Annotated[list[item], BeforeValidator(_unique_list), Field(min_length=min_length)]


class Section(BaseModel):
    """A section of params.yaml: unknown keys refused, values immutable once read; an empty
    section (``data:`` with nothing under it, which YAML reads as null) means the defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_default(cls, data):
        return {} if data is None else data


KEYED = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)+: ")


def known_keys(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    """The keys the section at ``loc`` inside ``model`` takes ([] where no model says)."""
    for part in loc:
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return []
        annotation = field.annotation
        model = annotation if isinstance(annotation, type) and \
            issubclass(annotation, BaseModel) else None
    return list(model.model_fields) if model is not None else []


def unknown_key(key: str, value, known) -> str:
    """``key: value is not a known key``, with the closest known key when one is close."""
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(known), n=1)
    return bad_value(key, value, "is not a known key"
                     + (f" (did you mean {close[0]!r}?)" if close else ""))


def problems_of(error: ValidationError, prefix: tuple = (),
                model: type[BaseModel] | None = None) -> list[str]:
    """One line per problem: the full dotted key, the value, what was expected; an unknown key
    names the closest key of its section (``model``: the model validated)."""
    out = []
    for e in error.errors():
        key = ".".join(str(p) for p in (*prefix, *e["loc"]) if not isinstance(p, int))
        if e["type"] == "value_error":
            for line in str(e["ctx"]["error"]).splitlines():  # a line may name its own key
                out.append(line if KEYED.match(line) else f"{key}: {line}")
        elif e["type"] == "extra_forbidden":
            out.append(unknown_key(key, e["input"], known_keys(model, e["loc"][:-1])))
        else:
            out.append(bad_value(key, e["input"], e["msg"][0].lower() + e["msg"][1:]))
    return out
