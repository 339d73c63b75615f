"""Errors that the CLI turns into one clear message and a non-zero exit."""


class DpclipError(Exception):
    """A problem the user can fix (bad parameter, missing file, bad data)."""


class ConfigError(DpclipError):
    """A parameter has a bad value. The message names the key and the value."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid parameters:\n  " + "\n  ".join(self.problems))

    def __reduce__(self):  # raised in a worker process, it comes back through pickle
        return type(self), (self.problems,)


def bad_value(key: str, value, why: str) -> str:
    """Format one problem line: the key, the offending value and what was expected."""
    return f"{key}: {value!r} {why}"
