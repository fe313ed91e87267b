"""Tool-integrated reasoning: the python tool (notebook state, errors, timeouts, output bounds,
hostile blocks), the stop-run-append loop (turns, call cap, token budget, masks), the rule that a
tool's output is not the answer, and one-line errors for bad tool settings."""

from __future__ import annotations

import pytest

from r1kit.errors import RecipeError
from r1kit.sampling import tool_loop
from r1kit.execution.tools import Tool, ToolConfig, from_recipe, output_block


@pytest.fixture(scope="module")
def tokenizer():
    from r1kit.offline.tiny import build_tokenizer

    return build_tokenizer()


def python(**bounds) -> Tool:
    return Tool(ToolConfig(name="python", **bounds))


# ---- the python tool ---------------------------------------------------------------------------


def test_blocks_share_state_like_notebook_cells_and_show_the_last_value():
    tool = python()
    first, second, third = tool.run(["x = 487 * 36\nprint(x)", "x + 1", "def f(n):\n    return n * x\nf(2)"], [[], ["x = 5"], ["x = 10"]])
    assert (first.text, first.ok) == ("17532\n", True)
    assert second.text == "6\n"  # sees the rollout's earlier cell, not another rollout's
    assert third.text == "20\n"
    # an earlier cell's output is not shown again, and an earlier failing cell does not stop the next
    (again,) = tool.run(["print(y)"], [["print('old')", "1/0", "y = 3"]])
    assert again.text == "3\n"


def test_an_error_shows_its_last_line_after_what_was_printed():
    (out,) = python().run(["print('before')\n{}['missing']"], [[]])
    assert out.text == "before\nKeyError: 'missing'" and not out.ok
    (syntax,) = python().run(["def f(:"], [[]])
    assert syntax.text.startswith("SyntaxError: ") and "<cell>" in syntax.text


def test_timeouts_floods_and_hostile_blocks_give_error_outputs():
    tool = python(timeout=1.0, output_chars=50)
    loop, flood, net, fork = tool.run(
        ["while True: pass", "while True: print('x' * 100)", "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
         "import os\nwhile True: os.fork()"],
        [[], [], [], []],
    )
    assert loop.timed_out and loop.text == "TimeoutError: the block ran past 1 s"
    assert flood.text.startswith("x" * 50) and flood.text.endswith("(output cut at 50 characters)") and not flood.ok
    assert not net.ok and "Error" in net.text  # no network in the sandbox
    assert not fork.ok  # stopped by the process limit or the clock, never the stage


def test_a_block_is_found_only_once_its_closing_fence_and_newline_are_written():
    tool = python()
    assert tool.find("think ```python\nprint(1)\n``") is None
    assert tool.find("think ```python\nprint(1)\n```") is None
    assert tool.find("think ```python\nprint(1)\n```\n and on") == "print(1)"
    assert tool.find("```output\n1\n```\n") is None


# ---- the loop ----------------------------------------------------------------------------------


class Scripted:
    """A stand-in engine: each turn of a rollout writes the next text of its script (tokenized),
    stopping where `stop` says, as r1kit's decoding loop does. A later turn's prompt (the question,
    the rollout so far and the tool's output) tells which rollout it continues."""

    def __init__(self, tokenizer, question: list[int], scripts: list[list[str]]):
        self.tokenizer, self.question, self.scripts = tokenizer, question, scripts
        self.first: list[list[int]] = []  # each rollout's first turn
        self.turns: list[int] = []  # rollouts per call

    def which(self, prompt: list[int]) -> int:
        rest = prompt[len(self.question):]
        return next(r for r, first in enumerate(self.first) if first and rest[: len(first)] == first)

    def __call__(self, prompts, counts, max_tokens, stop):
        first_turn = not self.turns
        self.turns.append(sum(counts))
        out = []
        for i, prompt in enumerate(p for p, n in zip(prompts, counts) for _ in range(n)):
            script = self.scripts[i if first_turn else self.which(prompt)]
            text = script.pop(0)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + ([] if script else [self.tokenizer.eos_token_id])
            tokens = []
            for t in ids[:max_tokens]:
                tokens.append(t)
                if stop(i, tokens):
                    break
            out.append(tokens)
            if first_turn:
                self.first.append(tokens)
        return out


def run(tokenizer, scripts, max_tokens=200, **bounds):
    question = tokenizer("Q", add_special_tokens=False)["input_ids"]
    engine = Scripted(tokenizer, question, scripts)
    transcripts = tool_loop.rollouts(engine, [question], [len(scripts)], max_tokens, [python(**bounds)], tokenizer, {tokenizer.eos_token_id})
    return transcripts, engine


def test_the_loop_stops_at_the_fence_runs_the_block_appends_the_output_and_goes_on(tokenizer):
    scripts = [["<think> ```python\nx = 6 * 7\nprint(x)\n```\n", "so ```python\nprint(x + 1)\n```\n", " </think> <answer> 42 </answer>"],
               ["<think> </think> <answer> 5 </answer>"]]
    (called, direct), engine = run(tokenizer, [list(s) for s in scripts])
    text = tokenizer.decode(called.ids, skip_special_tokens=True)
    assert text == "".join([scripts[0][0], output_block("42"), scripts[0][1], output_block("43"), scripts[0][2]])
    assert (called.calls, called.errors, called.blocks) == (2, 0, ["x = 6 * 7\nprint(x)", "print(x + 1)"])
    assert direct.calls == 0 and tokenizer.decode(direct.ids, skip_special_tokens=True) == scripts[1][0]
    assert engine.turns == [2, 1, 1]  # the direct rollout left after the first turn
    # the mask: 0 exactly on the tools' output tokens
    shown = [tokenizer(output_block(v), add_special_tokens=False)["input_ids"] for v in ("42", "43")]
    zeros = [t for t, m in zip(called.ids, called.mask) if m == 0]
    assert zeros == shown[0] + shown[1] and all(direct.mask)


def test_past_the_call_cap_blocks_are_not_run_and_the_rollout_goes_on(tokenizer):
    scripts = [["```python\nprint(1)\n```\n", "```python\nprint(2)\n```\n and more </think>"]]
    (t,), _ = run(tokenizer, scripts, calls=1)
    text = tokenizer.decode(t.ids, skip_special_tokens=True)
    assert t.calls == 1 and text.count("```output") == 1 and text.endswith("and more </think>")


def test_a_rollout_never_passes_its_token_budget_with_tool_output(tokenizer):
    scripts = [["```python\nprint('y' * 400)\n```\n", "never reached"]]
    budget = 40
    (t,), _ = run(tokenizer, scripts, max_tokens=budget, output_chars=1000)
    assert len(t.ids) == len(t.mask) == budget and t.mask[-1] == 0 and t.calls == 1


def test_loop_metrics_count_calls_errors_and_timeouts(tokenizer):
    scripts = [["```python\n1/0\n```\n", "x"], ["```python\nprint(1)\n```\n", "y"], ["none"]]
    transcripts, _ = run(tokenizer, scripts)
    m = tool_loop.metrics(transcripts)
    assert m["tools/calls_per_rollout"] == pytest.approx(2 / 3) and m["tools/call_share"] == pytest.approx(2 / 3)
    assert m["tools/error_share"] == 0.5 and m["tools/timeout_share"] == 0.0 and m["tools/sandbox_seconds"] > 0


def test_decode_ends_a_sample_where_stop_says(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from r1kit.sampling.decode import decode

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    torch.manual_seed(0)
    draw = lambda logits: torch.full((len(logits),), 7)  # noqa: E731  always token 7
    rows = decode(model, [[5, 6], [8]], [2, 1], 20, draw, {0}, 0, stop=lambda i, tokens: i == 1 and len(tokens) == 3)
    assert [len(r) for r in rows] == [20, 3, 20]


# ---- the answer is the model's, and settings -----------------------------------------------


def test_what_a_tool_printed_is_not_the_answer_until_the_model_restates_it():
    from r1kit.rewards.math import math_accuracy

    printed = "<think> ```python\nprint(6 * 7)\n```\n" + output_block("\\boxed{42}") + " </think>"
    restated = printed + " <answer> 42 </answer>"
    fake = "<think> </think> " + output_block("<answer> 42 </answer>")
    assert math_accuracy([printed, restated, fake], answer=["42"] * 3) == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "tools, expected",
    [
        (["nope"], "rl.tools[0]: unknown tool 'nope'"),
        ([{"name": "python", "calls": 0}], "rl.tools[0].calls must be above 0; got 0"),
        ([{"name": "python", "timeout": -1}], "rl.tools[0].timeout must be above 0"),
        ([{"name": "python", "cals": 2}], "rl.tools[0]"),
        ([{"calls": 2}], "rl.tools[0]"),
        (["tests.test_tools:no_language"], "rl.tools[0]: tool 'tests.test_tools:no_language' needs a `language` attribute"),
    ],
)
def test_bad_tool_settings_are_one_line_errors_at_validate_time(write_recipe, capsys, tools, expected):
    from r1kit.cli import main

    stage = {"name": "rl", "kind": "grpo", "data": {"source": "task:multiply", "task": {"n": 8}}, "tools": tools,
             "rewards": [{"name": "math_accuracy"}], "trainer": {"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 4}}
    path = write_recipe({"model": "tiny", "stages": [stage]})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1


def no_language(blocks, history, config):
    return []


def test_tool_names_and_bounds_are_read_from_the_recipe():
    (plain, bounded) = from_recipe(["python", {"name": "python", "calls": 2, "output_chars": 64}], "tools")
    assert (plain.calls, bounded.calls, bounded.output_chars) == (4, 2, 64)
    with pytest.raises(RecipeError, match=r"^tools\[0\]\.memory_mb must be above 0"):
        from_recipe([{"name": "python", "memory_mb": 0}], "tools")


def test_a_tool_call_is_not_code_in_the_chain_of_thought_but_other_code_is():
    from r1kit.text import without_tool_calls

    call = "```python\nprint(6 * 7)\n```\n" + output_block("42")
    assert without_tool_calls(f"<think> a {call} b </think>") == "<think> a  b </think>"
    written = "<think> ```python\nprint(6 * 7)\n```\n b </think>"  # never run: no output block after it
    assert without_tool_calls(written) == written
    from r1kit.filters import FilterConfig, sample_reason

    assert sample_reason(f"<think> a {call} b </think> <answer> 42 </answer>", 30, False, FilterConfig()) is None
    assert sample_reason(written + " <answer> 42 </answer>", 30, False, FilterConfig()) == "code_in_cot"


def test_sft_leaves_the_tool_outputs_of_its_rows_out_of_the_loss(tokenizer):
    from datasets import Dataset

    from r1kit.stages.sft import mask_tool_outputs

    shown = output_block("42")
    text = "What is 6 * 7? <think> ```python\nprint(6 * 7)\n```\n" + shown + " </think> <answer> 42 </answer>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    plain = tokenizer("What is 1 + 1? <think> </think> <answer> 2 </answer>", add_special_tokens=False)["input_ids"]
    rows = Dataset.from_list([{"input_ids": ids, "labels": ids}, {"input_ids": plain, "labels": plain}])
    masked = mask_tool_outputs(rows, tokenizer)
    labels = masked[0]["labels"]
    out = [t for t, label in zip(ids, labels) if label == -100]
    assert tokenizer.decode(out) == shown  # exactly the tool's block, fences included
    assert tokenizer.decode([t for t, label in zip(ids, labels) if label != -100]) == text.replace(shown, "")
    assert masked[1]["labels"] == plain
    untouched = Dataset.from_list([{"input_ids": plain, "labels": plain}])
    assert mask_tool_outputs(untouched, tokenizer) is untouched
