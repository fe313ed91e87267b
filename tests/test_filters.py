"""The rejection filters (r1kit.filters) on literal strings: each filter drops what it names and
keeps what it should, and duplicates are judged against the samples kept before them."""

from __future__ import annotations

import pytest

from r1kit.filters import (
    FilterConfig,
    filter_group,
    has_code_block,
    is_mixed_language,
    jaccard,
    longest_paragraph,
    repeated_ngram_share,
    sample_reason,
    shingles,
)

CLEAN = "<think> First add the units, then carry the one to the tens. </think> <answer> 42 </answer>"
ALL_OFF = FilterConfig(truncated=False, mixed_language=False, code_in_cot=False, repetition=False, exact_duplicates=False, near_duplicates=False)


def reason(text, tokens=10, truncated=False, **cfg):
    return sample_reason(text, tokens, truncated, FilterConfig(**cfg))


def test_a_clean_sample_passes_every_filter():
    assert reason(CLEAN, max_tokens=100, max_chars=1000, max_paragraph_chars=200) is None
    assert filter_group([CLEAN], [10], [False], FilterConfig()) == [None]


@pytest.mark.parametrize(
    "cot, language, expected",
    [
        ("We add the units first, then the tens.", "en", False),
        ("We add the units first, 然后 carry 进位 to the tens.", "en", True),
        ("先算个位，再算十位，所以答案是四十二。", "zh", False),
        ("先算个位 then carry the one 到十位", "zh", True),
        ("$3 + 4 = 7$, 12 + 30 = 42", "en", False),  # math only: no words, nothing mixed
        ("", "en", False),
        ("نجمع الآحاد أولا ثم العشرات", "en", True),  # a script no language of r1kit's has: still words
        ("Προσθέτουμε πρώτα τις μονάδες", "en", True),
    ],
)
def test_mixed_language(cot, language, expected):
    assert is_mixed_language(cot, language, 0.95) is expected


def test_mixed_language_threshold_and_only_the_chain_of_thought_counts():
    one_in_twenty = " ".join(["word"] * 19 + ["词"])  # 95% English
    assert not is_mixed_language(one_in_twenty, "en", 0.95)
    assert is_mixed_language(one_in_twenty, "en", 0.96)
    assert reason("<think> add the units </think> <answer> 四十二 </answer>") is None  # the answer is not the CoT
    assert reason("<think> add the 个位 units </think> <answer> 42 </answer>") == "mixed_language"
    assert reason("add the 个位 units </think> 42") == "mixed_language"  # prefilled <think>
    assert reason("<think> add the 个位 units </think> 42", mixed_language=False) is None


def test_code_blocks_inside_the_chain_of_thought():
    assert has_code_block("try:\n```python\nprint(1)\n```") and has_code_block("~~~\nx = 1\n~~~")
    assert not has_code_block("use `x` inline, not a block")
    assert reason("<think> let me test it\n```python\nprint(6*7)\n```\n</think> 42") == "code_in_cot"
    assert reason("<think> the function returns x + 1 </think>\n```python\ndef f(x):\n    return x + 1\n```") is None
    assert reason("<think>\n```\nx\n```\n</think> 42", code_in_cot=False) is None


def test_repetition():
    loop = "<think> " + "so the answer is 7 and " * 20 + "</think> 7"
    assert repeated_ngram_share(loop, 10) > 0.8
    assert repeated_ngram_share("one two three four five six seven eight nine ten eleven", 10) == 0.0
    assert repeated_ngram_share("too short to tell", 10) == 0.0
    assert repeated_ngram_share("a b a b a", 2) == pytest.approx(0.5)  # ab ba ab ba: two repeats of four
    assert reason(loop) == "repetition"
    assert reason(loop, repetition=False) is None
    assert reason(CLEAN, max_repetition=0.0) is None


def test_overlong_truncated_and_long_paragraphs():
    assert reason(CLEAN, tokens=101, max_tokens=100) == "overlong"
    assert reason(CLEAN, tokens=100, max_tokens=100) is None
    assert reason(CLEAN, max_chars=len(CLEAN) - 1) == "overlong"
    assert reason(CLEAN, truncated=True) == "truncated"
    assert sample_reason(CLEAN, 10, True, FilterConfig(truncated=False)) is None
    wall = "<think> short start.\n\n" + "x" * 300 + "\n\nshort end </think> 42"
    assert longest_paragraph("a\n\nbbb\n  \ncc") == 3
    assert reason(wall, max_paragraph_chars=299) == "long_paragraph"
    assert reason(wall, max_paragraph_chars=300) is None
    assert reason(wall) is None  # off by default


def test_the_first_filter_that_applies_is_the_reason():
    text = "<think> 个位 units\n```\ncode\n```\n</think> 42"
    assert reason(text, truncated=True) == "truncated"
    assert reason(text) == "mixed_language"
    assert reason(text, mixed_language=False) == "code_in_cot"


def test_exact_duplicates_after_normalisation():
    texts = [CLEAN, CLEAN.upper(), CLEAN.replace(" ", "   \n"), "<think> other </think> <answer> 41 </answer>"]
    cfg = FilterConfig(near_duplicates=False)
    assert filter_group(texts, [1] * 4, [False] * 4, cfg) == [None, "exact_duplicate", "exact_duplicate", None]
    assert filter_group(texts, [1] * 4, [False] * 4, ALL_OFF) == [None] * 4


def test_near_duplicates_by_shingled_jaccard():
    base = "<think> " + " ".join(f"step {i}: add {i} and {i + 1} to get {2 * i + 1}." for i in range(20)) + " </think> 42"
    one_word = base.replace("step 7:", "stage 7:")
    different = "<think> The tens digit is four and the units digit is two, so it is forty-two. </think> 42"
    assert jaccard(shingles(base), shingles(one_word)) > 0.95
    assert jaccard(shingles(base), shingles(different)) < 0.2
    assert jaccard(set(), set()) == 1.0 and shingles("abc") == {"abc"}
    group = [base, one_word, different]
    assert filter_group(group, [1] * 3, [False] * 3, FilterConfig()) == [None, "near_duplicate", None]
    assert filter_group(group, [1] * 3, [False] * 3, FilterConfig(near_duplicate_threshold=0.99)) == [None, None, None]


def test_duplicates_compare_with_kept_samples_only():
    dropped_first = "<think> ```code``` </think> 42"  # dropped by code_in_cot: does not shadow its copy
    group = [dropped_first, dropped_first.replace("```code```", "code"), dropped_first.replace("```code```", "code")]
    assert filter_group(group, [1] * 3, [False] * 3, FilterConfig()) == ["code_in_cot", None, "exact_duplicate"]
