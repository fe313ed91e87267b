"""Tests of the format and language_consistency rewards on literal completions."""

import time

import pytest

from r1kit.errors import RewardError
from r1kit.reward_registry import build, summary
from r1kit.rewards.format import format_reward
from r1kit.rewards.language import language_consistency
from r1kit.text import chain_of_thought



def growth(fn, make_input, n: int) -> float:
    """How much more CPU time fn takes on an input 8x as long: about 8 when linear, 64 when
    quadratic. CPU time of this thread, best of three, so other processes on the machine do not
    count; the threshold the tests use (22) sits at the geometric mean of the two."""
    small, large = make_input(n), make_input(8 * n)

    def cpu(x) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.thread_time()
            fn(x)
            best = min(best, time.thread_time() - start)
        return best

    return cpu(large) / max(cpu(small), 1e-6)


# ---------------------------------------------------------------------------------------------
# format

GOOD = "<think>\n2 + 2 is 4.\n</think>\n<answer>\n4\n</answer>\n"

FORMAT_CASES = [
    # completion, strict, lenient
    (GOOD, 1.0, 1.0),
    ("<think>a</think><answer>4</answer>", 1.0, 1.0),
    ("  <think>a</think>  <answer>4</answer>  ", 1.0, 1.0),
    ("Sure! <think>a</think><answer>4</answer>", 0.0, 1.0),  # text before the think block
    ("<think>a</think>So:<answer>4</answer>", 0.0, 1.0),  # text between the blocks
    ("<think>a</think><answer>4</answer> Hope this helps.", 0.0, 1.0),  # text after
    ("<answer>4</answer><think>a</think>", 0.0, 0.0),  # wrong order
    ("<think>a</think>", 0.0, 0.0),  # no answer block
    ("<answer>4</answer>", 0.0, 0.0),  # no think block
    ("<think>a<think>b</think></think><answer>4</answer>", 0.0, 1.0),  # nested think
    ("<think>a</think><answer>4</answer><answer>5</answer>", 0.0, 1.0),  # two answers
    ("<think> </think><answer>4</answer>", 0.0, 1.0),  # blank think block
    ("<think>a</think><answer> </answer>", 0.0, 1.0),  # blank answer block
    ("<think>a</think><answer>4", 0.0, 0.0),  # truncated
    ("a</think><answer>4</answer>", 0.0, 0.0),  # closes think without opening it
    ("", 0.0, 0.0),
]


@pytest.mark.parametrize("completion,strict,lenient", FORMAT_CASES)
def test_format_tags(completion, strict, lenient):
    assert format_reward([completion]) == [strict]
    assert format_reward([completion], mode="lenient") == [lenient]


def test_format_prefilled_think():
    # The chat template ended the prompt with "<think>": the completion starts inside the block.
    completions = [
        "2 + 2 is 4.\n</think>\n<answer>4</answer>",
        "<think>2 + 2 is 4.</think><answer>4</answer>",  # opened again: nested in the full text
        "2 + 2 is 4. <answer>4</answer>",  # never closed the think block
        "</think><answer>4</answer>",  # empty reasoning
    ]
    assert format_reward(completions, prefilled_think=True) == [1.0, 0.0, 0.0, 0.0]
    assert format_reward(completions, prefilled_think=True, mode="lenient") == [1.0, 1.0, 0.0, 1.0]
    # Without the flag, a completion that only closes the block is not rewarded.
    assert format_reward(completions[:1]) == [0.0]


def test_format_boxed_answers():
    completions = [
        "<think>2 + 2</think>\nSo the answer is $\\boxed{4}$.",
        "<think>2 + 2 = \\boxed{4}</think> done",  # the box is inside the reasoning
        "<think>2 + 2</think> so \\boxed{4",  # unbalanced
        "<think>2 + 2</think><answer>\\boxed{4}</answer>",  # tags where a box was asked for
        "Well <think>2 + 2</think> \\boxed{4}",
    ]
    assert format_reward(completions, answer_format="boxed") == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert format_reward(completions, answer_format="boxed", mode="lenient") == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert format_reward(["2 + 2</think> \\boxed{4}"], answer_format="boxed", prefilled_think=True) == [1.0]


def test_format_long_completions_stay_linear():
    def many_tags(n):
        return ["<answer>" * n + "</think>" * n, "<think>" + "x" * (10 * n) + "</think><answer>4</answer>"]

    assert growth(format_reward, many_tags, 12_500) < 22
    assert growth(lambda c: format_reward(c, mode="lenient"), many_tags, 12_500) < 22


def test_a_recipe_value_outside_a_parameters_choices_is_refused_when_built(write_recipe, capsys):
    from r1kit.cli import main

    stage = {"name": "rl", "kind": "grpo", "data": {"source": "task:addition"}, "rewards": [{"name": "format", "mode": "stric"}]}
    assert main(["validate", str(write_recipe({"model": "tiny", "stages": [stage]}))]) == 2
    err = capsys.readouterr().err
    assert "rl.rewards[0]: reward 'format': parameter 'mode' must be one of 'strict', 'lenient'; got 'stric' (did you mean 'strict'?)" in err


def test_format_rejects_unknown_parameters():
    with pytest.raises(RewardError, match="mode must be one of"):
        format_reward(["x"], mode="loose")
    with pytest.raises(RewardError, match="answer_format must be one of"):
        format_reward(["x"], answer_format="latex")


# ---------------------------------------------------------------------------------------------
# language_consistency


def test_chain_of_thought():
    assert chain_of_thought("<think>abc</think><answer>1</answer>") == "abc"
    assert chain_of_thought("prefilled abc</think><answer>1</answer>") == "prefilled abc"
    assert chain_of_thought("<think>truncated") == "truncated"
    assert chain_of_thought("no tags at all") == "no tags at all"


def test_language_english():
    completions = [
        "<think>First add the two numbers, then divide by $2$.</think><answer>3</answer>",
        "<think>首先把两个数相加，然后除以二。</think><answer>3</answer>",
        "<think>First 我们 add them.</think>",  # 3 English words, 2 Han characters
        "<think>The sum is \\frac{a}{b} = 3, so x = 3.</think>",  # math and variables don't count
        "<think></think><answer>3</answer>",  # empty chain of thought
        "<think>$1 + 2 = 3$</think>",  # only math: nothing countable
        "Add the numbers; the answer is 3.",  # no tags: the whole completion
    ]
    assert language_consistency(completions) == [1.0, 0.0, 0.6, 1.0, 0.0, 0.0, 1.0]


def test_language_chinese():
    completions = [
        "<think>设 $x$ 为 5，所以答案是 10。</think><answer>10</answer>",  # 7 Han characters, math removed
        "<think>我们 compute the sum 然后</think>",  # 4 Han characters, 3 English words
        "<think>Let x be 5.</think>",
        "先相加 then divide</think><answer>3</answer>",  # prefilled: reasoning before </think>
    ]
    scores = language_consistency(completions, language="zh")
    assert scores == pytest.approx([1.0, 4 / 7, 0.0, 3 / 5])


def test_language_other_scripts_and_errors():
    assert language_consistency(["<think>Сложим числа.</think>"], language="ru") == [1.0]
    assert language_consistency(["<think>숫자를 더합니다</think>"], language="ko") == [1.0]
    assert language_consistency(["<think>数を足します</think>"], language="ja") == [1.0]
    with pytest.raises(RewardError, match="language must be one of"):
        language_consistency(["x"], language="english")


def test_language_long_text_stays_linear():
    def text(n):
        return ["<think>" + "\\(" * (3 * n) + "word " * n + "</think>"]

    assert growth(language_consistency, text, 12_500) < 22


# ---------------------------------------------------------------------------------------------
# Both are registered rewards with their parameters


def test_registered():
    fmt = build("format", {"mode": "lenient", "prefilled_think": True, "answer_format": "boxed"})
    assert fmt(["a</think> \\boxed{1}"]) == [1.0]
    lang = build("language_consistency", {"language": "zh"})
    assert lang(["<think>中文</think>"]) == [1.0]
    assert summary(fmt.fn).startswith("1.0 when the completion follows the R1 template")
    assert summary(lang.fn).startswith("Share of the chain of thought")


def test_format_sees_a_prefilled_think_in_the_prompt_column():
    from r1kit.rewards.format import format_reward

    completion = "reasoning </think> <answer> 4 </answer>"
    prompts = ["Assistant: <think>\n", "Assistant:"]
    assert format_reward([completion, completion], prompt=prompts) == [1.0, 0.0]


def test_a_column_named_like_a_parameter_does_not_override_it():
    from r1kit.reward_registry import build

    reward = build("format", {"mode": "lenient"})
    # `mode` and `answer_format` arrive as columns too; the parameters keep their values.
    assert reward(["<think> a </think> <answer> 1 </answer> extra"], mode=["strict"], answer_format=["boxed"]) == [1.0]
