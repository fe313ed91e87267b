"""Text logic that rewards and r1kit's core both need: where a completion's final answer is, and
what its chain of thought says in which script.

- ``extract_answer(text, fallback="none")``: the final answer, trusted in this order: the last
  ``<answer>…</answer>`` block (the ``\\boxed{}`` inside it, or its only formula when the rest
  is words: "The answer is $5$." gives ``5``), else the last complete ``\\boxed{…}``/
  ``\\fbox{…}``, else, with ``fallback="last_number"``, the last number.
- ``last_boxed(text)``: the content of the last complete ``\\boxed{…}``/``\\fbox{…}``.
- ``chain_of_thought(text)``: the text inside ``<think>…</think>``; when the completion closes
  ``</think>`` without opening it (the prompt prefilled ``<think>``) the text before it; an
  unclosed ``<think>`` runs to the end; without tags the whole completion.
- ``opens_think(prompt)``: the rendered prompt ends by opening ``<think>`` (a prefilled
  reasoning block), so the completion starts inside it.
- ``target_share(text, language)``: the share of countable words written in the script of
  ``language`` (one of ``SCRIPTS``); the heuristic is described in r1kit.rewards.language.

Pure string work, linear in the text's length. It judges nothing: verifiers (r1kit.rewards.math)
and filters (r1kit.filters) decide what the extracted text is worth.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from r1kit.errors import RewardError

# ---------------------------------------------------------------------------------------------
# The final answer

Fallback = Literal["none", "last_number"]
FALLBACKS: tuple[str, ...] = get_args(Fallback)


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
# `\{` and `\}` are literal set braces in LaTeX, not grouping: they do not count for balance.
BRACE = re.compile(r"(?<!\\)[{}]")
_FORMULA = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{…}`` or ``\\fbox{…}`` in `text`, or None."""
    starts = [m.end() - 1 for m in _BOX.finditer(text)]  # positions of the opening "{"
    if not starts:
        return None
    # One pass from the first box start pairs every brace; a truncated `\boxed{` stays open.
    close: dict[int, int] = {}
    stack: list[int] = []
    for m in BRACE.finditer(text, starts[0]):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            close[stack.pop()] = m.start()
    for start in reversed(starts):
        if start in close:
            content = text[start + 1 : close[start]].strip()
            return content or None
    return None


def _sole_formula(content: str) -> str:
    """The formula of an answer written as a sentence around it ("The answer is $5$."), when
    it is the only formula and the words hold no digits; else the content as it is."""
    if len(content) > 1000:  # answers are short; this bounds the lazy regex's backtracking
        return content
    formulas = list(_FORMULA.finditer(content))
    if len(formulas) == 1 and not re.search(r"\d", _FORMULA.sub(" ", content)):
        inner = next(g for g in formulas[0].groups() if g is not None).strip()
        if inner:
            return inner
    return content


def extract_answer(text: str, fallback: str = "none") -> str | None:
    """The final answer `text` gives: ``<answer>`` block, else last ``\\boxed{}``, else (with
    ``fallback="last_number"``) the last number; None when there is none."""
    if fallback not in FALLBACKS:
        raise RewardError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start >= 0:
        content = text[start + len("<answer>") : end].strip()
        if content:
            boxed = last_boxed(content)
            return boxed if boxed is not None else _sole_formula(content)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if fallback == "last_number":
        last = None
        for last in _NUMBER.finditer(text):
            pass
        return last.group() if last else None
    return None


# ---------------------------------------------------------------------------------------------
# The chain of thought and its script

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3040-\u30ff"
_LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
SCRIPTS = {
    "en": re.compile(f"[{_LATIN}]+"),
    "zh": re.compile(f"[{_HAN}]+"),
    "ja": re.compile(f"[{_HAN}{_KANA}]+"),
    "ko": re.compile("[\uac00-\ud7af\u1100-\u11ff\u3130-\u318f]+"),
    "ru": re.compile("[\u0400-\u04ff]+"),
}
_MATH_OPEN = re.compile(r"\$\$|\$|\\\(|\\\[")
_MATH_CLOSE = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_COMMAND = re.compile(r"\\[A-Za-z]+")
# One token per Han/kana character, else a run of letters (\w without digits and underscore).
_WORD = re.compile(f"[{_HAN}{_KANA}]|[^\\W\\d_{_HAN}{_KANA}]+")
_SINGLE_LATIN = re.compile(f"[{_LATIN}]")


def opens_think(prompt) -> bool:
    """The rendered prompt (a string; anything else is not one) ends by opening ``<think>``."""
    return isinstance(prompt, str) and prompt.rstrip().endswith("<think>")


def chain_of_thought(text: str) -> str:
    """The reasoning part of a completion (see the module docstring)."""
    start = text.find("<think>")
    end = text.find("</think>")
    if start >= 0 and (end < 0 or start < end):
        body = text[start + len("<think>") :]
        closed = body.find("</think>")
        return body if closed < 0 else body[:closed]
    if end >= 0:
        return text[:end]
    return text


def _strip_math(text: str) -> str:
    """`text` without its math segments and LaTeX commands, in linear time: once a delimiter
    has no closing partner, later ones of that kind cannot have one either."""
    parts, kept_from, pos, unclosed = [], 0, 0, set()
    while m := _MATH_OPEN.search(text, pos):
        opener = m.group()
        close = -1 if opener in unclosed else text.find(_MATH_CLOSE[opener], m.end())
        if close < 0:
            unclosed.add(opener)
            pos = m.end()
            continue
        parts += [text[kept_from : m.start()], " "]
        pos = kept_from = close + len(_MATH_CLOSE[opener])
    parts.append(text[kept_from:])
    return _COMMAND.sub(" ", "".join(parts))


def target_share(text: str, language: str) -> float:
    """Share of countable words of `text` written in `language`'s script; 0.0 if none."""
    script = SCRIPTS[language]
    words = [w for w in _WORD.findall(_strip_math(text)) if not _SINGLE_LATIN.fullmatch(w)]
    if not words:
        return 0.0
    return sum(1 for w in words if script.fullmatch(w)) / len(words)
