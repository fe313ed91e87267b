"""A tiny causal LM and tokenizer, built offline, for tests, benchmarks and CPU demos.

    r1kit tiny-model OUTDIR            # or `model: tiny` in a recipe

Builds a byte-level BPE tokenizer trained on a small built-in corpus (arithmetic, the R1 prompt
template, English) and a randomly initialised Qwen2-architecture model, and saves both in Hugging
Face format: `AutoModelForCausalLM.from_pretrained(OUTDIR)` and `AutoTokenizer` load them with no
network. Same arguments, same seed → identical files.

Details that matter (each would silently break training if wrong):
- transformers loads a ``qwen2`` tokenizer as Qwen2Tokenizer and rebuilds its pre-tokenizer, so the
  BPE is trained with Qwen2's normalizer and split regex; token ids survive the reload.
- ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` are plain added tokens, not special ones:
  trainers decode completions with ``skip_special_tokens=True`` and special tags would vanish.
- head_dim stays ≥ 32 (vLLM's CPU attention does not support 16).

`build_tiny_reward_model` builds a random one-output classifier on the same config and tokenizer,
for the ``reward_model`` reward.

It does not build anything that knows a task: the model starts random; recipes teach it.
"""

from __future__ import annotations

import random
from pathlib import Path

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]
# Without tools the template renders what it always did; with tools it lists them one line each
# (name, typed parameters, description: a few dozen tokens), an assistant's calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen's form) and the environment's
# replies in turns of role ``tool``. The model's turns sit in {% generation %} blocks (nothing
# rendered), so that TRL's assistant-only loss can train on them alone.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}{% set f = t.function or t %}{{ '\\n' }}{{ f.name }}("
    "{% for k, v in f.parameters.properties.items() %}{{ k }}: {{ v.type }}{{ ', ' if not loop.last }}{% endfor %})"
    ": {{ f.description }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% macro turn(message) %}{{ message['content'] or '' }}{% for call in message.tool_calls or [] %}"
    "<tool_call>{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}<|im_end|>{% endmacro %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ turn(message) }}{% endgeneration %}{% else %}{{ turn(message) }}{% endif %}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# How transformers' parse_response reads an assistant turn of CHAT_TEMPLATE back into a message
# (content and tool calls), as TRL does for Qwen's template.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = [
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
        "The assistant first thinks about the reasoning process in the mind and then provides the user with "
        "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
        "</answer> tags, respectively. User: What is 12 + 7? Assistant: <think> 12 + 7 = 19 </think> "
        "<answer> 19 </answer>",
        "Please reason step by step, and put your final answer within \\boxed{}.",
        "The answer is \\boxed{42}. Let me add the numbers digit by digit and carry the one.",
        "def solve(x):\n    return x + 1\n",
    ]
    for _ in range(400):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        lines.append(f"What is {a} {op} {b}? {a} {op} {b} = {eval(f'{a}{op}{b}')}. so the answer is {a}")
    return lines


def _tool_corpus(seed: int) -> list[str]:
    """Function calls and tool lists as CHAT_TEMPLATE renders them, for a tokenizer that knows
    tool calling: a few common tools, each with one typed argument."""
    rng = random.Random(seed)
    tools = [("guess", "number", "integer"), ("lookup", "key", "string"), ("search", "query", "string"),
             ("add", "a", "integer"), ("get_weather", "city", "string"), ("move", "direction", "string"),
             ("calculate", "expression", "string"), ("read_file", "path", "string")]
    words = ["paris", "up", "left", "x + 1", "notes.txt", "tokyo", "apple"]
    lines = []
    for _ in range(300):
        name, arg, kind = rng.choice(tools)
        value = rng.randint(0, 99) if kind == "integer" else f'"{rng.choice(words)}"'
        lines.append(f'<tool_call>{{"name": "{name}", "arguments": {{"{arg}": {value}}}}}</tool_call>')
        lines.append(f"Tools:\n{name}({arg}: {kind}): Return the result.")
    return lines


def build_tokenizer(vocab_size: int = 400, seed: int = 0, extra: list[str] | None = None, tool_vocab: bool = False):
    """A byte-level BPE tokenizer with Qwen2's pre-tokenization, the R1 tags and a chat template,
    trained on the built-in corpus and the texts of `extra`. With `tool_vocab` it also trains on
    function calls (merges for their JSON) and has ``<tool_call>`` and ``</tool_call>`` as tokens,
    as the tokenizers of tool-calling models do (Qwen2.5's); without it, a call is spelled out
    nearly a character a token."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed) + (extra or []) + (_tool_corpus(seed) if tool_vocab else []), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.add_tokens(TAGS + (TOOL_TAGS if tool_vocab else []))  # plain tokens: they survive skip_special_tokens=True
    fast.chat_template = CHAT_TEMPLATE
    fast.response_template = RESPONSE_TEMPLATE
    return fast


def shape_problem(hidden_size: int = 64, num_heads: int = 2, num_kv_heads: int = 1, **_) -> str | None:
    """What keeps these arguments from making a model every backend runs, in one line, or None:
    heads that split the hidden size into parts of at least 32 (vLLM's CPU attention takes no
    smaller head), and query heads a multiple of the key-value heads."""
    if hidden_size % num_heads or hidden_size // num_heads < 32:
        return f"hidden_size / num_heads must be a whole number of at least 32 (the head size), got {hidden_size} / {num_heads}"
    if num_heads % num_kv_heads:
        return f"num_heads must be a multiple of num_kv_heads, got {num_heads} and {num_kv_heads}"
    return None


def tiny_tokenizer(vocab_size: int = 400, seed: int = 0, pretrain_steps: int = 0, tool_vocab: bool = False, **model_args):
    """The tokenizer `build_tiny_model` gives a model built with these arguments (the others shape
    the model, not its tokenizer): known before the model is built."""
    from r1kit.offline import corpus

    extra = corpus.documents(2000, seed) if pretrain_steps else None
    return build_tokenizer(vocab_size=vocab_size, seed=seed, extra=extra, tool_vocab=tool_vocab)


def build_tiny_model(
    out_dir: str | Path,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    vocab_size: int = 400,
    max_position_embeddings: int = 1024,
    pretrain_steps: int = 0,
    pretrain_batch_size: int = 64,
    tool_vocab: bool = False,
    seed: int = 0,
) -> Path:
    """Build and save the tiny model and tokenizer into `out_dir`; returns it.

    With `pretrain_steps`, the model is then pretrained on r1kit.offline.corpus (a base model that has seen
    reasoning in free text; its tokenizer also learns from that corpus), `pretrain_batch_size`
    documents a step. `tool_vocab`: a tokenizer that knows function calls (build_tokenizer)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from r1kit.offline import corpus

    problem = shape_problem(hidden_size, num_heads, num_kv_heads)
    if problem:
        raise ValueError(f"tiny model: {problem}")
    out_dir = Path(out_dir)
    tokenizer = tiny_tokenizer(vocab_size, seed, pretrain_steps, tool_vocab)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    if pretrain_steps:
        corpus.pretrain(model, tokenizer, pretrain_steps, pretrain_batch_size, seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    # The reload must tokenize exactly as the tokenizer we trained; fail loudly if not.
    probe = "<think> 12 + 345 = 357 </think> <answer> 357 </answer>"
    reloaded = AutoTokenizer.from_pretrained(out_dir)
    if reloaded(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
        raise RuntimeError("tiny model: the saved tokenizer changes token ids on reload")
    return out_dir


def build_tiny_reward_model(model_dir: str | Path, out_dir: str | Path, seed: int = 0) -> Path:
    """A random one-output sequence classifier on the tiny model's config and tokenizer (for the
    ``reward_model`` reward in tests and checks); its score head is spread (std 1) so that
    different texts get clearly different scores. Saved into `out_dir`; returns it."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForSequenceClassification

    out_dir = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
