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

from typing import Literal

from r1kit.errors import RewardError
from r1kit.text import SCRIPTS, chain_of_thought, target_share

LANGUAGES = tuple(SCRIPTS)


def language_consistency(completions: list[str], *, language: Literal[LANGUAGES] = "en", **columns) -> list[float]:
    """Share of the chain of thought written in the target language (R1's language reward).

    `language` is one of en, zh, ja, ko, ru (checked by script, see the module docstring).
    """
    if language not in SCRIPTS:
        raise RewardError(f"language_consistency: language must be one of {sorted(SCRIPTS)}, got {language!r}")
    return [target_share(chain_of_thought(c), language) for c in completions]


language_consistency.bounds = (0.0, 1.0)
