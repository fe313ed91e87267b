"""Multiple-choice questions: the prompt, the seeded shuffle of the choices, and the letter a
completion answers.

    from r1kit.evaluation.choices import answer_letter, prompt, shuffled
    order = shuffled(4, seed=0, key="rec0aB")              # a permutation, the same on every run
    text = prompt("Which gas ...?", ["N2", "O2", "CO2", "Ar"])
    answer_letter("... so the gas is nitrogen.\\nAnswer: A", ["N2", "O2", "CO2", "Ar"])   # "A"

**The prompt** follows the convention of GPQA's evaluations in lighteval and open-r1 (after
OpenAI's simple-evals): the question, then the choices as ``A) ...`` lines, and an instruction to
reason first and end with a line ``Answer: LETTER``.

**The shuffle**: GPQA lists the correct answer first, so its choices are put in an order drawn
from ``(seed, problem id)``: the gold position differs from problem to problem, is the same on
every run with that seed, and the seed is recorded in the evaluation's summary.

**The answer** (`answer_letter`) is read from the final answer span: what follows the last
``</think>`` (the whole text if there is none), the ``<answer>`` block if it has one, and never a
tool's ``output`` block. In it, the first reader that finds something decides:

1. the ``\\boxed{...}`` answers (``\\boxed{C}``, ``\\boxed{\\text{(C)}}``): one letter, or none if
   boxes name different ones;
2. the last statement of the answer: an ``Answer: C`` line (``**Answer:** (C)``, ``Answer: Option
   B``) before any ``the answer is C`` / ``the correct option is C``;
3. the whole span, when it is only a choice (``C``, ``(C)``, ``C) 42 kJ``).

What such a reader found is the choice whose text it is to the letter, case included (GPQA's
items ``c``, ``a``, ``b``, ``d`` as choices: ``c`` is the item, not the letter C); else a letter
when it is one alone or in parentheses; else a choice when it is exactly one choice's text
(spacing, case and a final period aside; after ``Answer:``, over as many lines as the text takes),
even a text that starts like a letter (GPQA's ``A = benzoquinone, B = methyl 2-hydroxypropanoate`` is one choice's text,
not the letter A); else a letter followed (in a statement) by anything but another choice joined
to it, or (in the whole span) only by that choice's own text. Where case alone tells two choices
apart (``kT`` and ``KT``), the text in the same case names one. A letter followed by exactly
another choice's text (``The answer is A = benzoquinone`` where benzoquinone is C) is that other
choice: the model lettered the choices in another order, and the text says which it meant. A
hedge names no choice and scores 0: ``A or B``, ``A/B``, ``either B or C``, ``\\boxed{A, C}``,
``C, or maybe D``. A completion still inside ``<think>`` (cut off, or never closing a reasoning
block its prompt opened) has no final answer.

Not here: answers given only in the reasoning (a model that never states a final answer scores
0), choice letters beyond J, and free-text similarity (a paraphrase of a choice is no answer).
"""

from __future__ import annotations

import random
import re

from r1kit.text import boxed, without_tool_outputs

LETTERS = "ABCDEFGHIJ"

INSTRUCTION = (
    "Answer the following multiple-choice question. Think it through step by step, then give your "
    "final answer as the last line of your response, in the form 'Answer: LETTER' (without quotes), "
    "where LETTER is one of {letters}."
)

_MARKUP = re.compile(r"\*\*|__|\$|\\[()\[\]]|\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
# "Answer: C", "Final answer - C": a statement with a colon (or dash) wins over a later "... is C".
_COLON = re.compile(r"\b(?:answer|option|choice)\b\s*[:=-]\s*([^\n]+)", re.IGNORECASE)
# "the answer is (C)", "the correct option would be C" ("isn't" is no statement).
_IS = re.compile(r"\b(?:answer|option|choice)\b\s*(?:is|would be)\b\s*:?\s*([^\n]+)", re.IGNORECASE)
# What a statement may put before its letter: "Option B", "The answer is (D)".
_LEAD_IN = re.compile(r"^(?:(?:the\s+)?(?:correct\s+|final\s+|right\s+)?(?:answer|option|choice)\s*(?:is\b|would be\b|[:=-])?\s*)+", re.IGNORECASE)
# A letter at the start of what was found: "C", "(C)", "C)", "C.", "[C]", "b)" then the rest.
_LEADING = re.compile(r"(?:[(\[]?([A-J])(?:[)\].:]|(?=[\s,/&]|$))|[(\[]?([a-j])[)\]])(.*)", re.DOTALL)
_LONE_LETTER = re.compile(r"[(\[]?([A-Ja-j])[)\].]?")
# Another choice joined to the first: "A or B", "A/B", "(A) and (B)", "C, or maybe D".
_HEDGE = re.compile(r"^\s*(?:,|/|&|\bor\b|\band\b)\s*(?:(?:or|and|maybe|possibly|perhaps|probably)\s+)*[(\[]?([A-J])(?![A-Za-z0-9'])")


def prompt(question: str, choices: list[str]) -> str:
    """The question with its choices lettered A, B, ... and the instruction to end on ``Answer: LETTER``."""
    letters = LETTERS[: len(choices)]
    lines = [f"{letter}) {choice.strip()}" for letter, choice in zip(letters, choices)]
    return INSTRUCTION.format(letters=", ".join(letters)) + "\n\n" + question.strip() + "\n\n" + "\n".join(lines)


def shuffled(n: int, seed: int, key: str) -> list[int]:
    """A permutation of range(n) decided by `seed` and `key` (a problem's id) alone."""
    order = list(range(n))
    random.Random(f"{seed}:{key}").shuffle(order)
    return order


def _plain(text: str) -> str:
    """`text` without emphasis, dollar signs and \\text{} wrappers, trimmed of spacing and a final period."""
    previous = None
    while previous != text:
        previous, text = text, _MARKUP.sub(lambda m: m.group(1) or "", text)
    return text.strip().rstrip(".").strip()


def _same(a: str, b: str) -> bool:
    return " ".join(_plain(a).lower().split()) == " ".join(_plain(b).lower().split())


def _named_by_text(found: str, choices: list[str]) -> str | None:
    """The letter of the one choice whose text `found` is (spacing, case and a final period
    aside; where case alone tells two choices apart, the one in the same case), or None."""
    letters = LETTERS[: len(choices)]
    named = [i for i, choice in enumerate(choices) if _same(found, choice)]
    if len(named) > 1:
        named = [i for i in named if " ".join(_plain(found).split()) == " ".join(_plain(choices[i]).split())]
    return letters[named[0]] if len(named) == 1 else None


def _choice_in(found: str, choices: list[str], statement: bool = True) -> str | None:
    """The letter `found` names (see the module docstring), or None. Outside a statement (the
    whole span) only a lone letter, a choice's whole text, or a letter followed by its own
    choice's text, counts."""
    letters = LETTERS[: len(choices)]
    found = _plain(found)
    if statement:
        found = _LEAD_IN.sub("", found).strip()
    exact = [i for i, choice in enumerate(choices) if " ".join(_plain(choice).split()) == " ".join(found.split())]
    if len(exact) == 1:  # a choice's text to the letter, case included: "c" where the choices are items a-d
        return letters[exact[0]]
    lone = _LONE_LETTER.fullmatch(found)
    if lone and lone.group(1).upper() in letters:
        return lone.group(1).upper()
    whole = _named_by_text(found, choices)
    if whole:  # a choice's own text, even one that starts like a letter ("A = benzoquinone, B = ...")
        return whole
    lead = _LEADING.match(found)
    if lead and (lead.group(1) or lead.group(2)).upper() in letters:
        letter, rest = (lead.group(1) or lead.group(2)).upper(), lead.group(3).strip()
        own = choices[letters.index(letter)]
        text = rest.lstrip(")].:=- ")
        if not rest or _same(rest, own) or _same(text, own):
            return letter
        named = _named_by_text(text, choices)
        if named:  # "A = <the text of C>": the letter of another order, the choice by its text
            return named
        if not statement:
            return None
        hedge = _HEDGE.match(rest)
        return None if hedge and hedge.group(1) in letters and hedge.group(1) != letter else letter
    return None


def final_span(completion: str, prefilled: bool = False) -> str | None:
    """Where the final answer is: after the last ``</think>``, inside the ``<answer>`` block if
    any; None while a ``<think>`` (the completion's, or the prompt's when `prefilled`) is open."""
    text = without_tool_outputs(completion)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text or prefilled:
        return None  # still reasoning: nothing is final yet
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>") : end] if start >= 0 else text


def answer_letter(completion: str, choices: list[str], prefilled: bool = False) -> str | None:
    """The letter of the choice `completion` answers, or None (no final answer, or a hedge).
    `prefilled`: the prompt opened ``<think>``, so the completion starts inside it."""
    span = final_span(completion, prefilled)
    if span is None:
        return None
    boxes = boxed(span)
    if boxes:
        named = {_choice_in(box, choices) for box in boxes}
        return named.pop() if len(named) == 1 else None  # boxes that name different letters hedge
    plain = _plain(span)
    statements = list(_COLON.finditer(plain)) or list(_IS.finditer(plain))
    if statements:  # the rest of the span may be a whole choice's text over several lines (a list of reagents)
        last = statements[-1]
        return _named_by_text(plain[last.start(1):], choices) or _choice_in(last.group(1), choices)
    return _choice_in(span, choices, statement=False)


def hub_rows(rows: list[dict], source: str) -> list[dict]:
    """Rows of GPQA's hub schema (``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``,
    ``Record ID``, ``High-level domain``) as rows of r1kit's: ``id``, ``problem``, ``choices`` (the
    correct one first), ``answer`` ``"A"`` and ``subject`` (Physics, Chemistry, Biology: the
    breakdown); rows already in r1kit's schema pass as they are."""
    out = []
    for i, row in enumerate(rows, 1):
        if "choices" in row:
            out.append(row)
            continue
        missing = [k for k in ("Question", "Correct Answer", "Incorrect Answer 1") if k not in row]
        if missing:
            raise ValueError(
                f"{source}: row {i} has neither 'choices' nor GPQA's fields (missing {', '.join(map(repr, missing))})"
            )
        wrong = [row[k] for k in ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3") if row.get(k) is not None]
        subject = {"subject": row["High-level domain"]} if "High-level domain" in row else {}  # the per-subject breakdown
        out.append({"id": row.get("Record ID", str(i - 1)), "problem": row["Question"], "choices": [row["Correct Answer"], *wrong], "answer": "A", **subject})
    return out


def gold_index(row: dict, where: str) -> int:
    """The position of the correct choice in ``row["choices"]``: ``answer`` is its letter, its
    text, or its 0-based index."""
    choices, answer = row["choices"], row.get("answer")
    if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS) or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"{where}: choices must be a list of 2 to {len(LETTERS)} strings")
    letters = LETTERS[: len(choices)]
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        return answer
    if isinstance(answer, str) and answer.strip() in letters:
        return letters.index(answer.strip())
    same = [i for i, c in enumerate(choices) if isinstance(answer, str) and _same(answer, c)]
    if len(same) != 1:
        raise ValueError(f"{where}: answer must be one of {', '.join(letters)}, the text of one choice or its 0-based index, got {answer!r}")
    return same[0]
