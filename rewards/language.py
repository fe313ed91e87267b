"""Language-consistency reward (DeepSeek-R1, section 2.3.3): the share of the chain of thought
written in the target language.

R1 added this reward because RL made the reasoning drift between languages; it is the
proportion of target-language words in the chain of thought. Recipe use::

    rewards: [{name: language_consistency, weight: 0.1, language: zh}]

The chain of thought is the text inside ``<think>…</think>``; when the completion closes
``</think>`` without opening it (the prompt prefilled ``<think>``) it is the text before
``</think>``; an unclosed ``<think>`` runs to the end; without tags it is the whole completion.

The heuristic, by script rather than by language model:

- math is language-neutral and removed first: ``$…$``, ``$$…$$``, ``\\(…\\)``, ``\\[…\\]`` and
  LaTeX commands (``\\frac``, ``\\sqrt``...); digits and punctuation never count;
- words are runs of letters split on whitespace, digits and punctuation; Han characters and
  Japanese kana have no spaces between words, so each character counts as one word;
- a single Latin letter is taken for a variable (``x``, ``n``) and not counted;
- a word counts for the target when all its letters are in the target's script:
  ``en`` Latin, ``zh`` Han, ``ja`` Han or kana, ``ko`` Hangul, ``ru`` Cyrillic.

The score is target words / counted words, 0.0 when nothing countable is left (an empty chain
of thought). It cannot tell languages that share a script apart (``en`` accepts French), and
it counts a Chinese word of two characters twice, so mixed texts lean slightly towards Han.
"""

from __future__ import annotations

import re

from r1kit.rewards import RewardError

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


def language_consistency(completions: list[str], *, language: str = "en", **columns) -> list[float]:
    """Share of the chain of thought written in the target language (R1's language reward).

    `language` is one of en, zh, ja, ko, ru (checked by script, see the module docstring).
    """
    if language not in SCRIPTS:
        raise RewardError(f"language_consistency: language must be one of {sorted(SCRIPTS)}, got {language!r}")
    return [target_share(chain_of_thought(c), language) for c in completions]
