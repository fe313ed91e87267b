"""The errors r1kit reports to users, declared once and imported where they are raised, and the
"did you mean" hint their messages share.

Each carries a one-line message meant for the person who wrote the recipe, the data or the
reward; the command line prints it as ``r1kit: error: ...`` and exits with status 2. This module
imports nothing of r1kit's, so every layer can use it.
"""

from __future__ import annotations

import difflib


class RecipeError(ValueError):
    """A recipe (or an override of it) is not valid; the message is one line for the user."""


class DataError(RecipeError):
    """A dataset is missing, unreadable, or lacks a column a stage needs."""


class RewardError(ValueError):
    """A reward could not be found, configured, or returned a malformed result."""


def suggest(name: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of `choices`, or nothing."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class EvalError(RecipeError):
    """Bad evaluation input (benchmark, completions, settings); one line for the user."""
