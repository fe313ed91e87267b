"""Text logic that rewards and r1kit's core both need: where a completion's final answer is, and
what its chain of thought says in which script.

- ``extract_answer(text, fallback="none")``: the final answer, trusted in this order: the last
  ``<answer>…</answer>`` block (a "final answer is …" statement after its last box, else its
  last box group, else its only formula when the rest is words: "The answer is $5$." gives
  ``5``), else the same in the whole text, else, with ``fallback="last_number"``, the last
  number. A box group is the last complete ``\\boxed{…}``/``\\fbox{…}`` and the boxes right
  before it separated only by commas, "and"/"or", spacing, delimiters or labels
  (``\\boxed{1}, \\boxed{2}``, ``x_1 = \\boxed{2} \\quad x_2 = \\boxed{3}``); several boxes are one
  list answer ``1, 2``, which math-verify compares as a set.
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


def _boxes(text: str) -> list[tuple[int, int, int]]:
    """(start of the command, its "{", its matching "}") of every complete box, by start."""
    starts = [(m.start(), m.end() - 1) for m in _BOX.finditer(text)]  # and the opening "{"
    if not starts:
        return []
    # One pass from the first box start pairs every brace; a truncated `\boxed{` stays open.
    close: dict[int, int] = {}
    stack: list[int] = []
    for m in BRACE.finditer(text, starts[0][1]):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            close[stack.pop()] = m.start()
    return [(cmd, brace, close[brace]) for cmd, brace in starts if brace in close]


def _outer_boxes(text: str) -> list[tuple[int, int]]:
    """(start, end) of the content of every outermost complete box of `text`."""
    spans: list[tuple[int, int]] = []
    for _, brace, close in _boxes(text):
        if not spans or brace > spans[-1][1]:  # a box inside the previous one is part of it
            spans.append((brace + 1, close))
    return spans


def boxed(text: str) -> list[str]:
    """The content of every outermost complete ``\\boxed{…}``/``\\fbox{…}`` of `text`, in order,
    braces nested to any depth."""
    return [text[start:end] for start, end in _outer_boxes(text)]


def math_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the content of every outermost complete box of `text`; without boxes, of
    every ``$…$`` (``$$…$$``, ``\\(…\\)``, ``\\[…\\]``) formula; without either, all of it."""
    spans = _outer_boxes(text)
    if not spans:
        spans = [m.span(next(i for i in range(1, 5) if m.group(i) is not None)) for m in _FORMULA.finditer(text)]
    return spans or [(0, len(text))]


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{…}`` or ``\\fbox{…}`` in `text`, or None."""
    boxes = _boxes(text)
    return (text[boxes[-1][1] + 1 : boxes[-1][2]].strip() or None) if boxes else None


# What may stand between two boxes of one answer: spacing, commas, semicolons, "and"/"or" (also
# a short \text{} that ends with one: "\text{ for part (b) and }"), math delimiters and a label:
# `\boxed{1}, \boxed{2}`, `$\boxed{1}$ and $\boxed{2}$`, `\boxed{(2, 2)} \quad \text{and} \quad
# \boxed{(6, 2)}`, `x_1 = \boxed{2}, x_2 = \boxed{3}`.
_LABEL = r"[A-Za-z](?:_\{?\w{1,3}\}?)?\s*="
_BETWEEN = re.compile(
    r"(?:\s|[,;]|\$|\\[()\[\]]|\\[,;:! ]|\\q?quad(?![A-Za-z])|~|\band\b|\bor\b"
    r"|\\(?:text|mbox|textrm)\{\s*(?:[^{}]{0,30}?\b(?:and|or))?\s*,?\s*\}|" + _LABEL + r")*"
)


def _group(text: str, boxes: list[tuple[int, int, int]]) -> list[str]:
    """The contents of the last group of `boxes` (`_boxes(text)`): the last complete box and those
    right before it that only `_BETWEEN` text separates from it (a chain of thought that boxes a
    candidate and moves on in words does not join). Empty when there is no box."""
    if not boxes:
        return []
    group = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        between = text[box[2] + 1 : group[0][0]]
        # A blank line between two boxes ends a group: a new paragraph is a new attempt.
        if box[2] > group[0][0] or len(between) > 60 or re.search(r"\n\s*\n", between) or not _BETWEEN.fullmatch(between):
            break
        group.insert(0, box)
    return [content for _, start, end in group if (content := text[start + 1 : end].strip())]


# "The final answer is $X$" after the last box: that statement is the answer (math-verify reads
# it first too). Its rest of sentence is given as it is, delimiters and all.
_FINAL = re.compile(r"final answer(?: is|:)[\s:]*(\S.{0,119}?)(?:\s*I hope|\n|$)", re.IGNORECASE | re.DOTALL)


def _final_answer(span: str) -> str | None:
    """The answer of `span`, the text that holds the final answer: a "final answer is" statement
    after its last box, else its last box group (several boxes: one list ``a, b``), else None."""
    boxes = _boxes(span)
    tail = span[boxes[-1][2] + 1 :] if boxes else span
    statement = None
    for statement in _FINAL.finditer(tail):
        pass
    if statement is not None and _FORMULA.search(statement.group(1)):
        return statement.group(1).strip().strip('".')
    group = _group(span, boxes)
    return ", ".join(group) if group else None


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


OUTPUT_FENCE = "```output\n"
"""Opens the block in which a tool's output follows a rollout's code (r1kit.execution.tools)."""
_OUTPUT_BLOCK = re.compile(r"```output\n.*?(?:\n```|$)", re.DOTALL)


def without_tool_outputs(text: str) -> str:
    """`text` with the content of each tool ``output`` block removed (the fences stay): what a
    tool printed is not the model's own answer until the model writes it itself."""
    return _OUTPUT_BLOCK.sub(OUTPUT_FENCE + "```", text) if OUTPUT_FENCE in text else text


_TOOL_CALL = re.compile(r"```[\w+-]+[ \t]*\n.*?```[ \t]*\n```output\n.*?(?:\n```\n?|$)", re.DOTALL)


def tool_output_spans(text: str) -> list[tuple[int, int]]:
    """Where in `text` a tool wrote (r1kit.execution.tools): each ``output`` block that follows a fenced code
    block, fences and closing newline included, as (start, end) character offsets."""
    if OUTPUT_FENCE not in text:
        return []
    # The lazy code part of a call ends at its first closing fence, so the call's first output fence is its output's.
    return [(m.start() + m.group(0).index(OUTPUT_FENCE), m.end()) for m in _TOOL_CALL.finditer(text)]


def without_tool_calls(text: str) -> str:
    """`text` without its tool calls: each fenced block followed by the ``output`` block a tool
    appended (r1kit.execution.tools), both removed. Other fenced code stays."""
    return _TOOL_CALL.sub("", text) if OUTPUT_FENCE in text else text


def extract_answer(text: str, fallback: str = "none") -> str | None:
    """The final answer `text` gives: ``<answer>`` block, else last ``\\boxed{}``, else (with
    ``fallback="last_number"``) the last number; None when there is none. Tool output blocks
    do not count (`without_tool_outputs`)."""
    if fallback not in FALLBACKS:
        raise RewardError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    text = without_tool_outputs(text)
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start >= 0:
        content = text[start + len("<answer>") : end].strip()
        if content:
            final = _final_answer(content)
            return final if final is not None else _sole_formula(content)
    final = _final_answer(text)
    if final is not None:
        return final
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


def countable_words(text: str) -> list[str]:
    """The words of `text` in any script, outside its math, single Latin letters (variables) left out."""
    return [w for w in _WORD.findall(_strip_math(text)) if not _SINGLE_LATIN.fullmatch(w)]


def target_share(text: str, language: str) -> float:
    """Share of countable words of `text` written in `language`'s script; 0.0 if none."""
    script = SCRIPTS[language]
    words = countable_words(text)
    if not words:
        return 0.0
    return sum(1 for w in words if script.fullmatch(w)) / len(words)
