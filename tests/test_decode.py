"""r1kit's decoding loop against transformers' own: greedy tokens equal to ``model.generate``'s over
prompts of different lengths, several samples a prompt, samples that end early and leave the
batch, and caches that outgrow their first buffers, with the written-out Llama-family step
(r1kit.sampling.llama_step) and with the model's forward pass at each step; the two steps' logits
equal; its attention equal to SDPA's; the sampler's chunks of prompts and samples."""

from __future__ import annotations

import pytest
import torch

from r1kit.sampling import decode as decode_lib
from r1kit.sampling import llama_step
from r1kit.sampling.decode import decode, decode_attention
from r1kit.sampling.draws import Nucleus, greedy
from r1kit.sampling.hf_backend import chunks

PROMPTS = ["What is 3 + 4?", "Compute 12 * 3 and then add 7 to it, carefully.", "Hi", "What is 0 + 9? Think first."]


@pytest.fixture(scope="module")
def model_and_tokenizer(cold_start):
    """The tiny model after a short SFT: its greedy completions are worked answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cold_start, padding_side="left")
    return AutoModelForCausalLM.from_pretrained(cold_start, dtype=torch.float32).eval(), tokenizer


@pytest.fixture(params=["written-out step", "model forward", "model forward, eager attention"])
def steps(request, monkeypatch, model_and_tokenizer):
    """Decode with LlamaStep, or with the model's forward pass at each step (with its attention
    in SDPA, which the loop replaces by decode_attention, or in eager attention, which it leaves
    alone: each row then reads a copy of its prompt's keys and values); the batch widths of the
    decoding steps."""
    widths = []
    if request.param.startswith("model forward"):
        monkeypatch.setattr(llama_step.LlamaStep, "of", classmethod(lambda cls, *a, **kw: None))
    call = llama_step.LlamaStep.__call__
    monkeypatch.setattr(llama_step.LlamaStep, "__call__", lambda self, tokens, *a: widths.append(len(tokens)) or call(self, tokens, *a))
    model = model_and_tokenizer[0]
    model.set_attn_implementation("eager" if request.param.endswith("eager attention") else "sdpa")
    yield request.param, widths
    model.set_attn_implementation("sdpa")


def generate_greedy(model, tokenizer, prompts, max_tokens, eos_id):
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id)
    rows = []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        rows.append(row[: row.index(eos_id) + 1] if eos_id in row else row)
    return rows


@pytest.mark.parametrize("max_tokens", [1, 5, 150])  # 150 outgrows the first buffers (BLOCK 64) twice
def test_greedy_tokens_equal_generate(model_and_tokenizer, max_tokens, steps):
    model, tokenizer = model_and_tokenizer
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert len({len(i) for i in ids}) == len(ids)  # left padding of every width
    expected = generate_greedy(model, tokenizer, PROMPTS, max_tokens, tokenizer.pad_token_id)
    got = decode(model, ids, [2, 1, 3, 1], max_tokens, greedy, {tokenizer.pad_token_id}, tokenizer.pad_token_id)
    assert got == [expected[0]] * 2 + [expected[1]] + [expected[2]] * 3 + [expected[3]]


def test_samples_that_end_leave_the_batch_and_the_others_go_on(model_and_tokenizer, monkeypatch, steps):
    """With an end token that some prompts reach early, the batch shrinks, and every sample is
    still generate's: the ones that ended stop at their end token, the others run on."""
    model, tokenizer = model_and_tokenizer
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    free = generate_greedy(model, tokenizer, PROMPTS, 40, eos_id=-1)
    eos = free[0][3]  # prompt 0's fourth token: it ends there; the others end wherever they meet it, if they do
    expected = generate_greedy(model, tokenizer, PROMPTS, 40, eos)
    assert len(expected[0]) == 4 and max(len(r) for r in expected) == 40
    widths = steps[1]
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: widths.append(kw["input_ids"].shape[0]) or forward(*a, **kw))
    # Prompt 0's one sample ends early, under a quarter of the batch: its row runs on, ignored,
    # until more rows have ended.
    counts = [1, 8, 5, 1]
    got = decode(model, ids, counts, 40, greedy, {eos}, tokenizer.pad_token_id)
    assert got == [row for row, k in zip(expected, counts) for _ in range(k)]
    assert widths[0] == 4  # one prefill row a prompt (the model's forward pass in both cases)
    assert len(widths) == 40  # the prefill, then a decoding step for each token after the first
    assert widths[1:] == sorted(widths[1:], reverse=True) and widths[-1] < sum(counts)  # ended rows left


def test_attention_dropout_in_training_mode_still_reads_each_rows_prompt(model_and_tokenizer, monkeypatch, steps):
    """A model in training mode with attention dropout (GRPO rollouts, TRL's ``disable_dropout``
    being off by default) passes dropout to the attention: the one-token-a-row attention applies
    it and still attends to the prompt's shared positions. With dropout made the identity, the
    samples are generate's without dropout."""
    model, tokenizer = model_and_tokenizer
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    expected = generate_greedy(model, tokenizer, PROMPTS, 12, tokenizer.pad_token_id)
    rates = []
    monkeypatch.setattr(torch.nn.functional, "dropout", lambda x, p=0.5, training=True, inplace=False: rates.append(p) or x)
    sdpa = torch.nn.functional.scaled_dot_product_attention  # the prefill's: no dropout either
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, dropout_p=0.0, **kw: sdpa(*a, **kw))
    for layer in model.model.layers:
        monkeypatch.setattr(layer.self_attn, "attention_dropout", 0.25)
    model.train()
    try:
        got = decode(model, ids, [2, 1, 3, 1], 12, greedy, {tokenizer.pad_token_id}, tokenizer.pad_token_id)
    finally:
        model.eval()
    assert got == [expected[0]] * 2 + [expected[1]] + [expected[2]] * 3 + [expected[3]]
    assert rates and set(rates) == {0.25}  # the decoding steps' attention applied the model's dropout


def test_a_decoder_goes_on_from_its_cache_as_a_prefill_of_the_whole_sequences_would(model_and_tokenizer, steps):
    """Samples that ended at different steps (some left the batch early and were kept aside),
    kept in another order, with appended tokens of different lengths (none for one): the logits
    after `extend` are those of a prefill of each whole sequence, and the next turn's greedy
    tokens are `decode`'s from the whole sequences."""
    model, tokenizer = model_and_tokenizer
    pad = tokenizer.pad_token_id
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:3]]
    counts = [2, 3, 1]
    decoder = decode_lib.Decoder(model, greedy, {pad}, pad)
    decoder.start(ids, counts)
    first = decoder.generate(20, stop=lambda i, tokens: len(tokens) >= 3 + 2 * i)
    assert [len(t) for t in first] == [3, 5, 7, 9, 11, 13]
    words = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in (" So the answer", "", " Wait,", " is")]
    keep = [5, 0, 3, 2]
    decoder.extend(keep, words)
    rows = [p for p, n in zip(ids, counts) for _ in range(n)]
    whole = [rows[s] + first[s] + w for s, w in zip(keep, words)]
    with torch.no_grad():
        for k, sequence in enumerate(whole):
            expected = model(input_ids=torch.tensor([sequence])).logits[0, -1]
            torch.testing.assert_close(decoder.logits[k], expected, atol=1e-4, rtol=1e-4)
    assert decoder.generate(30) == decode(model, whole, [1] * len(whole), 30, greedy, {pad}, pad)


def test_turns_from_the_decoders_cache_equal_turns_from_whole_prompts(model_and_tokenizer):
    """r1kit.sampling.tool_loop's turns through a `Step`'s session and through a step function
    that prefills each turn's whole prompts: the same greedy transcripts."""
    from r1kit.sampling import tool_loop

    model, tokenizer = model_and_tokenizer
    pad = tokenizer.pad_token_id
    reply = tokenizer(" Go on:", add_special_tokens=False)["input_ids"]

    class Echo:  # every turn is cut at 6 tokens and answered, three times
        stop_strings, turn_tokens = [], 6

        def stop(self, transcript, tokens):
            return False

        def reply(self, turns):
            return [reply if t.turns < 3 and how != "cut" else None for t, _, how in turns]

    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    step = decode_lib.Step(model, greedy, {pad}, pad)
    with_cache = tool_loop.rollouts(step, ids, [2, 1, 1, 2], 60, Echo(), tokenizer, {pad})
    whole = tool_loop.rollouts(lambda *a: step(*a), ids, [2, 1, 1, 2], 60, Echo(), tokenizer, {pad})
    assert [(t.ids, t.mask, t.turns) for t in with_cache] == [(t.ids, t.mask, t.turns) for t in whole]
    assert max(t.turns for t in whole) == 3 and any(0 in t.mask for t in whole)


def llama(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "tie_word_embeddings": True, "pad_token_id": 0}
    return LlamaForCausalLM(LlamaConfig(**config | overrides)).eval()


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float32 under bfloat16 autocast"])
@pytest.mark.parametrize("arch", ["qwen2 (the tiny model)", "llama"])
def test_written_out_step_gives_the_model_forward_logits(model_and_tokenizer, monkeypatch, precision, arch, packed):
    """Every decoding step's logits, through rows leaving the batch and buffers regrowing, are
    the ones the model's forward pass gives: the same products in the same precision (keys and
    values kept in the autocast dtype, as autocast casts them for each product). Bit for bit with
    torch's own products; with oneDNN's packed ones (r1kit.hardware.cpu.packed_linears) the step joins the
    q/k/v and gate/up products, which oneDNN does not promise to round as the separate ones, so
    there within rounding."""
    import copy

    from r1kit.hardware import cpu

    if not packed:
        monkeypatch.setattr(cpu, "packing_available", lambda dtype=torch.float32: False)
    model = copy.deepcopy(model_and_tokenizer[0]) if arch.startswith("qwen2") else llama()
    model = model.to(torch.bfloat16) if precision == "bfloat16" else model
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    assert llama_step.LlamaStep.of(model, 8, decode_attention) is not None

    def run():
        seen, picks = [], torch.Generator().manual_seed(0)

        def draw(logits):  # the same tokens both ways, whatever the logits
            seen.append(logits.clone())
            tokens = torch.randint(2, logits.shape[-1], (len(logits),), generator=picks)
            tokens[: len(seen) % 3] = 1  # some rows end at each step: the batch shrinks
            return tokens

        with torch.autocast("cpu", dtype=torch.bfloat16, enabled="autocast" in precision):
            decode(model, prompts, [3, 2, 3], 40, draw, {1}, 0)
        return seen

    ours = run()
    with monkeypatch.context() as m:
        m.setattr(llama_step.LlamaStep, "of", classmethod(lambda cls, *a, **kw: None))
        theirs = run()
    assert len(ours) == len(theirs) > 5 and ours[-1].shape[0] < 8
    assert ours[-1].dtype == (torch.float32 if precision == "float32" else torch.bfloat16)
    rounding = {"rtol": 1e-4, "atol": 1e-4} if precision == "float32" else {"rtol": 0.02, "atol": 0.02}
    for a, b in zip(ours, theirs):
        if packed:
            torch.testing.assert_close(a, b, **rounding)
        else:
            assert torch.equal(a, b)


def test_written_out_step_leaves_other_models_to_their_forward_pass(model_and_tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    assert llama_step.LlamaStep.of(llama(), 4, decode_attention) is not None
    adapted = get_peft_model(llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).base_model.model
    assert llama_step.LlamaStep.of(adapted, 4, decode_attention) is None  # adapter layers
    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                                            max_window_layers=0))
    assert "sliding_attention" in sliding.config.layer_types and llama_step.LlamaStep.of(sliding, 4, decode_attention) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2))
    assert llama_step.LlamaStep.of(gpt2, 4, decode_attention) is None
    assert llama_step.LlamaStep.of(llama(hidden_act="gelu"), 4, decode_attention) is None


def test_decode_attention_equals_sdpa_on_buffer_views():
    """One query a row against keys and values that are views of a growing buffer (zero past the
    written positions), with grouped-query attention and a padding mask, as SDPA computes it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    layer = decode_lib.GrowingLayer()
    layer.update(torch.randn(3, 2, 7, 16), torch.randn(3, 2, 7, 16))
    key, value = layer.update(torch.randn(3, 2, 1, 16), torch.randn(3, 2, 1, 16))
    assert key.shape == (3, 2, 8, 16) and layer.buffers[1].shape[-2] > 8
    query = torch.randn(3, 6, 1, 16)
    mask = torch.ones(3, 1, 1, 8, dtype=torch.bool)
    mask[1, ..., :3] = False
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    ours, _ = decode_attention(module, query, key, value, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, query, key.contiguous(), value.contiguous(), mask, scaling=0.25)
    torch.testing.assert_close(ours, theirs)


def test_shared_prefix_attention_equals_sdpa_over_each_rows_whole_cache():
    """Rows that share their prompt's cached positions (a prompt with no rows, prompts with
    different numbers of rows) attend as SDPA does over the prompt's positions followed by the
    row's own; still after rows leave and a prefix no row reads is dropped."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    layer = decode_lib.GrowingLayer()
    prompt_keys, prompt_values = torch.randn(3, 2, 7, 16), torch.randn(3, 2, 7, 16)
    layer.update(prompt_keys, prompt_values)
    prompt = torch.tensor([0, 0, 2, 2, 2])
    rows = decode_lib.PromptRows(prompt, 3)
    layer.share(rows, 1)  # room for one position of each row's own: the second step outgrows it
    own_keys, own_values = torch.randn(5, 2, 0, 16), torch.randn(5, 2, 0, 16)
    padding = torch.ones(3, 7, dtype=torch.bool)
    padding[2, :2] = False
    cache = decode_lib.DynamicCache()
    cache.layers = [layer]
    for step, keep in enumerate([None, None, torch.tensor([0, 3, 4]), None]):  # 2 steps, drop rows, 2 more
        if keep is not None:
            rows = decode_lib.select_rows(cache, rows, keep, 4)
            prompt, own_keys, own_values = prompt[keep], own_keys[keep], own_values[keep]
        new_keys, new_values = torch.randn(len(prompt), 2, 1, 16), torch.randn(len(prompt), 2, 1, 16)
        key, value = layer.update(new_keys, new_values)
        own_keys, own_values = torch.cat([own_keys, new_keys], 2), torch.cat([own_values, new_values], 2)
        assert layer.get_seq_length() == 7 + own_keys.shape[2]
        query = torch.randn(len(prompt), 6, 1, 16)
        mask = torch.cat([padding[prompt], torch.ones(len(prompt), own_keys.shape[2], dtype=torch.bool)], 1)[:, None, None]
        ours, _ = decode_attention(module, query, key, value, mask, scaling=0.25)
        whole_keys = torch.cat([prompt_keys[prompt], own_keys], 2)
        whole_values = torch.cat([prompt_values[prompt], own_values], 2)
        theirs, _ = sdpa_attention_forward(module, query, whole_keys, whole_values, mask, scaling=0.25)
        torch.testing.assert_close(ours, theirs)
    assert layer.prefix[0].shape[0] == 2  # prompt 1 had no rows; after the drop, prompts 0 and 2 only


def test_sampler_chunks_fit_the_cache_budget(tiny_model, monkeypatch):
    """Without a batch_size, a chunk holds as many samples as keep their keys and values within
    CACHE_BYTES, at most MAX_ROWS; a batch_size given is the chunk size."""
    from r1kit.sampling import hf_backend

    sampler = hf_backend.HFSampler(str(tiny_model), dtype="float32")
    config = sampler.model.config
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    assert sampler.rows_for(64) == hf_backend.MAX_ROWS
    monkeypatch.setattr(hf_backend, "CACHE_BYTES", per_position * (100 + decode_lib.BLOCK) * 10)
    assert sampler.rows_for(100) == 10 and sampler.rows_for(10**9) == 1
    seen = []
    real = hf_backend.decode
    monkeypatch.setattr(hf_backend, "decode", lambda model, prompts, counts, *a: seen.append(sum(counts)) or real(model, prompts, counts, *a))
    sampler.generate(["a", "b", "c"], 4, hf_backend.SamplingParams(temperature=0.0, max_tokens=100))
    assert seen == [10, 2]
    sampler.batch_size, seen[:] = 5, []
    sampler.generate(["a", "b", "c"], 4, hf_backend.SamplingParams(temperature=0.0, max_tokens=100))
    assert seen == [5, 5, 2]


def test_chunks_hold_at_most_batch_size_samples_in_order():
    assert list(chunks(3, 4, 8)) == [(0, [(0, 4), (1, 4)]), (8, [(2, 4)])]
    assert list(chunks(2, 5, 4)) == [(0, [(0, 4)]), (4, [(0, 1), (1, 3)]), (8, [(1, 2)])]
    assert list(chunks(1, 1, 64)) == [(0, [(0, 1)])]


def test_nucleus_draws_one_token_a_row():
    torch.manual_seed(0)
    logits = torch.randn(5, 300)
    tokens = Nucleus(0.6, 0.9).draw(logits)
    assert tokens.shape == (5,) and tokens.dtype == torch.long


def test_categorical_draws_a_possible_token_at_the_top_of_the_unit_interval(monkeypatch):
    """A uniform variate just under 1 (torch.rand's float64 draws reach 1 - 2**-53): rounding must
    not carry the draw past the last possible token, into one of probability 0 or past the
    vocabulary (a padded last block)."""
    from r1kit.sampling.draws import categorical

    logits = torch.zeros(2, 300)
    logits[1, 200:] = -float("inf")
    monkeypatch.setattr(torch, "rand", lambda *shape, dtype=None, device=None: torch.full(shape, 1 - 2.0**-30, dtype=dtype, device=device))
    assert categorical(logits).tolist() == [299, 199]


@pytest.mark.parametrize("vocab", [512, 700])
def test_categorical_draws_the_softmax(vocab):
    """r1kit's inverse-CDF draw against the softmax it samples: frequencies within sampling noise,
    tokens at block edges and in a padded last block included, impossible tokens never."""
    from r1kit.sampling.draws import categorical

    torch.manual_seed(0)
    logits = torch.full((2, vocab), -float("inf"))
    logits[0, [0, 255, 256, vocab - 1]] = torch.tensor([0.0, 1.0, 2.0, 1.5])  # the edges of blocks of 256
    logits[1] = torch.randn(vocab) * 2
    drawn = torch.stack([categorical(logits) for _ in range(20000)])
    assert drawn.max() < vocab
    for row in range(2):
        frequencies = torch.bincount(drawn[:, row], minlength=vocab).float() / drawn.size(0)
        exact = logits[row].softmax(-1)
        assert frequencies[exact == 0].sum() == 0
        assert (frequencies - exact).abs().sum().item() / 2 < 0.05  # total variation; 20,000 draws give about 0.03 on 700 tokens
