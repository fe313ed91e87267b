"""Multiple-choice questions: the prompt, the seeded shuffle of the choices, and the letter a
completion answers.

    from r1kit.choices import answer_letter, prompt, shuffled
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

1. the last ``\\boxed{...}`` (``\\boxed{C}``, ``\\boxed{\\text{(C)}}``);
2. the last statement of the answer (``Answer: C``, ``**Answer:** (C)``, ``the answer is C.``,
   ``the correct option is C``);
3. the whole span, when it is only a choice (``C``, ``(C)``, ``C) 42 kJ``).

What such a reader found is a letter when it is one: alone or in parentheses, possibly followed
by that choice's own text; else it is a choice when it is exactly one choice's text (spacing, case
and a final period aside). A hedge names no choice and scores 0: ``A or B``, ``either B or C``,
``\\boxed{A, C}``, a letter followed by another one (``C, or maybe D``).

Not here: answers given only in the reasoning (a model that never states a final answer scores
0), choice letters beyond J, and free-text similarity (a paraphrase of a choice is no answer).
"""

from __future__ import annotations

import random
import re

from r1kit.text import last_boxed, without_tool_outputs

LETTERS = "ABCDEFGHIJ"

INSTRUCTION = (
    "Answer the following multiple-choice question. Think it through step by step, then give your "
    "final answer as the last line of your response, in the form 'Answer: LETTER' (without quotes), "
    "where LETTER is one of {letters}."
)

_MARKUP = re.compile(r"\*\*|__|\$|\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
# "Answer: C", "the answer is (C)", "final answer: C", "correct option is C", "Answer - C".
_STATEMENT = re.compile(r"\b(?:answer|option|choice)\b\s*(?:is|would be|:|-|=)\s*:?\s*([^\n]+)", re.IGNORECASE)
# A letter at the start of what was found: "C", "(C)", "C)", "C.", "[C]", then the rest.
_LEADING = re.compile(r"[(\[]?([A-J])(?:[)\].:]|(?=\s|$|,))(.*)", re.DOTALL)
_LONE_LETTER = re.compile(r"[(\[]?([A-Ja-j])[)\].]?")
_OTHER_LETTER = re.compile(r"(?<![A-Za-z0-9'])[(\[]?([A-J])(?:[)\]]|(?![A-Za-z0-9']))")


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


def _choice_in(found: str, choices: list[str]) -> str | None:
    """The letter `found` names (see the module docstring), or None."""
    letters = LETTERS[: len(choices)]
    found = _plain(found)
    lone = _LONE_LETTER.fullmatch(found)
    if lone and lone.group(1).upper() in letters:
        return lone.group(1).upper()
    lead = _LEADING.match(found)
    if lead and lead.group(1) in letters:
        letter, rest = lead.group(1), lead.group(2).strip()
        own = choices[letters.index(letter)]
        if not rest or _same(rest, own) or _same(rest.lstrip(")].:- "), own):
            return letter
        others = {m.group(1) for m in _OTHER_LETTER.finditer(rest)} & set(letters)
        return letter if not others - {letter} else None
    matches = [letters[i] for i, choice in enumerate(choices) if _same(found, choice)]
    return matches[0] if len(matches) == 1 else None


def final_span(completion: str) -> str:
    """Where the final answer is: after the last ``</think>``, inside the ``<answer>`` block if any."""
    text = without_tool_outputs(completion)
    text = text.rsplit("</think>", 1)[-1]
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>") : end] if start >= 0 else text


def answer_letter(completion: str, choices: list[str]) -> str | None:
    """The letter of the choice `completion` answers, or None (no answer, or a hedge)."""
    span = final_span(completion)
    boxed = last_boxed(span)
    if boxed is not None:
        return _choice_in(boxed, choices)
    statements = list(_STATEMENT.finditer(_plain(span)))
    if statements:
        return _choice_in(statements[-1].group(1), choices)
    return _choice_in(span, choices)


def hub_rows(rows: list[dict], source: str) -> list[dict]:
    """Rows of GPQA's hub schema (``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``,
    ``Record ID``) as rows of r1kit's: ``id``, ``problem``, ``choices`` (the correct one first) and
    ``answer`` ``"A"``; rows already in r1kit's schema pass as they are."""
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
        out.append({"id": row.get("Record ID", str(i - 1)), "problem": row["Question"], "choices": [row["Correct Answer"], *wrong], "answer": "A"})
    return out


def gold_index(row: dict, where: str) -> int:
    """The position of the correct choice in ``row["choices"]``: ``answer`` is its letter or its text."""
    choices, answer = row["choices"], row.get("answer")
    if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS) or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"{where}: choices must be a list of 2 to {len(LETTERS)} strings")
    letters = LETTERS[: len(choices)]
    if isinstance(answer, str) and answer.strip() in letters:
        return letters.index(answer.strip())
    same = [i for i, c in enumerate(choices) if isinstance(answer, str) and _same(answer, c)]
    if len(same) != 1:
        raise ValueError(f"{where}: answer must be one of {', '.join(letters)} or the text of one choice, got {answer!r}")
    return same[0]
