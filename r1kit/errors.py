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


class HubUnreachable(RecipeError):
    """A hub id (dataset, model, tokenizer) could not be fetched: no network, or offline mode."""


HUB_ERRORS = ("OfflineModeIsEnabled", "LocalEntryNotFoundError")
"""huggingface_hub's errors for a file it could not fetch and does not have."""
HUB_WORDS = ("couldn't connect to 'https://huggingface.co'", "on the Hub")
"""What transformers' and datasets' messages say when the hub did not answer."""


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) says the Hugging Face Hub could not be reached (a
    connection error of anything else, a server or a sandbox, is not this)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if {t.__name__ for t in type(exc).__mro__} & set(HUB_ERRORS) or any(w in str(exc) for w in HUB_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class from_hub:
    """``with from_hub("Qwen/Qwen2.5-7B", "name a local folder as the model"):`` turns a failure to
    reach the hub into one line naming what was asked for and the offline way (`HubUnreachable`)."""

    def __init__(self, what: str, offline: str):
        self.what, self.offline = what, offline

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None and not isinstance(exc, RecipeError) and isinstance(exc, Exception) and unreachable(exc):
            raise HubUnreachable(f"{self.what}: the Hugging Face Hub cannot be reached (no network or HF_HUB_OFFLINE set); {self.offline}") from None
        return False

