"""Every method of TRL's trainers that r1kit overrides, in one file: `GRPOTrainer` (the grpo stage)
and `DistillationTrainer` (the distill stage), subclasses of TRL's own.

Each override takes one of r1kit's paths where it holds and TRL's own code elsewhere; which was
taken is decided once, when the trainer is built, and kept in ``trainer.paths`` ("on", or "off:"
and the reason), which the stage records with its figures and the run report shows:

- ``r1kit_decoding_loop``: rollouts (or the student's samples) come from r1kit's decoding loop
  (``_generate_single_turn``; r1kit.trainers.rollouts decides when it may stand in);
- ``tool_rollouts``: rollouts that run code, as TRL's ``rollout_func`` (r1kit.trainers.rollouts);
- ``zero_advantage_skip``: completions with zero advantage leave the loss's forward and backward
  pass (``_compute_loss``; r1kit.trainers.zero_advantage);
- ``shared_prompts``: each group's prompt is scored once (``_get_per_token_logps_and_entropies``;
  r1kit.trainers.shared_prompts);
- ``dynamic_sampling``: DAPO's refill of zero-signal groups (``_generate_and_score_completions``,
  ``_calculate_rewards``; r1kit.trainers.dynamic_sampling);
- ``async_generation``: rollouts drawn by a generator process up to ``max_staleness`` steps ahead
  (transformers' ``get_batch_samples`` sends the coming prompts, ``_generate_single_turn`` takes the
  drawn batches, or with tools the ``rollout_func``; r1kit.trainers.async_generation). Its batches
  carry the generator's log-probabilities as PPO's old ones (``_generate_and_score_completions``);
  where the recipe asks for TRL's importance-sampling correction instead, the trainer tells TRL its
  samples come from elsewhere (``use_vllm``, read only by TRL's generation methods, which r1kit's
  override, and by that correction, which is what it turns on).

Written against TRL 1.16 (`WRITTEN_AGAINST`): `check` compares each overridden method's parameters
and each patched module-level function's (r1kit.trainers.trl_patches) with the installed libraries,
and the trainers check, once built, that the attributes the paths read exist; a difference stops
the stage with one line before any compute. pyproject.toml keeps TRL below the next minor release.

Not here: a loss of r1kit's own (TRL's loss runs, on fewer rows or fewer tokens), module-level
patches (r1kit.trainers.trl_patches).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from dataclasses import dataclass

import trl

from r1kit.errors import RecipeError
from r1kit.trainers import async_generation, dynamic_sampling, rollouts, shared_prompts, trl_patches, zero_advantage

log = logging.getLogger(__name__)

WRITTEN_AGAINST = "1.16"
# transformers, whose functions r1kit patches (r1kit.trainers.trl_patches) and whose Trainer methods
# the trainers inherit: the release written against, and pyproject.toml's range (a test holds it to
# pyproject's; the range's floor is tested against that release's wheel).
TRANSFORMERS_WRITTEN_AGAINST, TRANSFORMERS_RANGE = "5.19", "transformers>=5.17"
# "Class.method": its parameters in the TRL written against (see `params`); the methods r1kit
# overrides, and TRL's private ones it calls.
OVERRIDDEN = {
    "GRPOTrainer._compute_loss": "self, model, inputs",
    "GRPOTrainer._get_per_token_logps_and_entropies": "self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, "
    "compute_entropy=False, compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, "
    "pixel_attention_mask=None, spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, "
    "mm_token_type_ids=None, image_position_ids=None",
    "GRPOTrainer._generate_single_turn": "self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False",
    "GRPOTrainer._generate_and_score_completions": "self, inputs",
    "GRPOTrainer._calculate_rewards": "self, inputs, prompts, completions, completion_ids_list",
    "DistillationTrainer._generate_single_turn": "self, prompt_ids, images, multimodal_fields, has_tool_images=False",
    "GRPOTrainer.get_batch_samples": "self, epoch_iterator, num_batches, device",
    "GRPOTrainer._tokenize_prompts": "self, prompts",
}
# The attributes of a built trainer that the paths' decisions and overrides read.
READS = {
    "GRPOTrainer": ("beta", "_entropy_bonus_enabled", "top_entropy_quantile", "aux_loss_enabled", "loss_type", "use_vllm",
                    "use_transformers_continuous_batching", "_is_vlm", "max_completion_length", "generation_config",
                    "eos_token_ids", "_tokenizer", "_metrics", "num_generations", "multi_objective_aggregation",
                    "reward_weights", "rollout_func", "ref_model", "vllm_importance_sampling_correction",
                    "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"),
    "DistillationTrainer": ("use_vllm", "_is_vlm", "max_completion_length", "generation_config", "eos_token_ids", "_tokenizer"),
}


def params(fn) -> str:
    """A function's parameters as written in its definition, without annotations."""
    return ", ".join(str(p.replace(annotation=inspect.Parameter.empty)) for p in inspect.signature(fn).parameters.values())


def _resolve(dotted: str):
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def fits(expected: str, found: str) -> bool:
    """Whether parameters `found` (as `params` writes them) are what r1kit relies on: `expected`
    exactly, or where it holds ``...``, the parameters before it, any others, then those after it."""
    lead, dots, tail = expected.partition(", ..., ")
    if not dots:
        return found == expected
    return re.fullmatch(f"{re.escape(lead)}(, .+)?, {re.escape(tail)}", found) is not None


def check() -> None:
    """Refuse, in one line, an installed TRL or transformers whose methods or functions that r1kit
    overrides or patches take other parameters than those it relies on; the line names the library
    whose code differs (a method the trainers inherit may be transformers')."""
    import transformers

    targets = {f"trl.{name}": ("overrides", expected) for name, expected in OVERRIDDEN.items()}
    targets |= {name: ("patches", expected) for name, expected in trl_patches.TARGETS.items()}
    for name, (does, expected) in targets.items():
        target = _resolve(name)
        if target is not None and fits(expected, params(target)):
            continue
        library = name.partition(".")[0]
        if does == "overrides":  # the class that defines the method: TRL's trainer, or a class of transformers it inherits
            kind, method = name.split(".")[1:]
            library = next((c.__module__ for c in getattr(trl, kind).__mro__ if method in vars(c)), library).partition(".")[0]
        title, written, installed, fix = {
            "trl": ("TRL", WRITTEN_AGAINST, trl.__version__, f"trl~={WRITTEN_AGAINST}.0"),
            "transformers": ("transformers", TRANSFORMERS_WRITTEN_AGAINST, transformers.__version__, TRANSFORMERS_RANGE),
        }[library]
        found = "nothing" if target is None else f"({params(target)})"
        raise RecipeError(f"r1kit {does} {name}({expected}), written against {title} {written}; the installed {title} "
                          f"{installed} has {found}: install {fix} (pyproject.toml's range)")


def _require(trainer, kind: str) -> None:
    missing = [name for name in READS[kind] if not hasattr(trainer, name)]
    if missing:
        raise RecipeError(f"r1kit reads {kind}.{missing[0]}, which the installed TRL {trl.__version__} does not set "
                          f"(written against TRL {WRITTEN_AGAINST}): install trl~={WRITTEN_AGAINST}.0")


def _loop_path(trainer, **more: bool):
    """r1kit's loop as a step function where it may stand in on a CPU, else None; and the path's record."""
    refusals = ["not on a CPU"] if trainer.accelerator.device.type != "cpu" else rollouts.refusals(trainer, **more)
    if refusals:
        return None, f"off: {', '.join(refusals)}"
    return rollouts.loop_step(trainer), "on"


@dataclass
class Features:
    """What a grpo stage asks of r1kit's trainer; each is taken only where it holds."""

    skip_zero_advantage: bool = True
    share_prompts: bool = False
    dynamic_sampling_rounds: int | None = None
    """DAPO's dynamic sampling with at most this many refill rounds; None: off."""
    tools: list | None = None
    environments: list | None = None
    """Gym-style environments (r1kit.environments.Spec) whose turns r1kit's rollout function plays."""
    max_staleness: int | None = None
    """Asynchronous generation at most this many optimizer steps ahead; None: in the trainer's step."""
    where: str = ""
    """The recipe file and stage a refusal names (``recipe.yaml: rl.``)."""


class GRPOTrainer(trl.GRPOTrainer):
    """TRL's GRPOTrainer with r1kit's paths (see the module's docstring); ``features`` says which
    are asked for."""

    _ratio_rows: dict | None = None  # the rows of the loss being computed, for the ratio's figures (asynchronous rollouts)

    def __init__(self, *args, features: Features | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        _require(self, "GRPOTrainer")
        features = features or Features()
        self.paths: dict[str, str] = {}
        self.loop = None
        if features.tools and features.max_staleness is not None:
            self.loop, self.paths["r1kit_decoding_loop"] = _loop_path(self)  # the generator's loop, held to the same guard
            self.paths["tool_rollouts"] = "on: the asynchronous generator's decoding loop"
        elif features.tools:
            loop = not self.use_vllm
            beyond = rollouts.logits_processing_beyond_the_loop(self) if loop else []
            if beyond:
                log.warning("rollouts with tools come from r1kit's decoding loop, which does not apply %s", ", ".join(beyond))
            self.rollout_func = rollouts.tool_rollout_func(self, features.tools, loop)
            self.paths["tool_rollouts"] = "on: r1kit's decoding loop" if loop else "on: TRL's vLLM engine"
            self.paths["r1kit_decoding_loop"] = "off: tools (the tool rollouts' own loop)"
        elif features.environments:
            loop = not self.use_vllm
            self.rollout_func = rollouts.env_rollout_func(self, features.environments, loop)
            self.paths["tool_rollouts"] = f"on: a gym-style environment's turns, {'r1kit' if loop else 'vLLM'}'s decoding loop"
            self.paths["r1kit_decoding_loop"] = "off: environment (the rollouts' own loop)"
        else:
            self.paths["tool_rollouts"] = "off: no tools"
            self.loop, self.paths["r1kit_decoding_loop"] = _loop_path(
                self, continuous_batching=self.use_transformers_continuous_batching)
        self.skipping = self._path("zero_advantage_skip", features.skip_zero_advantage, zero_advantage.refusal(self))
        self.sharing = self._path("shared_prompts", features.share_prompts, shared_prompts.refusal(self))
        self._unfit: set[int] = set()  # models whose cache cannot be shared (shared_prompts)
        rounds = features.dynamic_sampling_rounds
        self.dynamic = None if rounds is None else dynamic_sampling.DynamicSampling(rounds, self.args.seed)
        self.paths["dynamic_sampling"] = "off: not asked" if rounds is None else f"on: at most {rounds} refill rounds"
        self.generator = self.feed = None
        if features.max_staleness is None:
            self.paths["async_generation"] = "off: not asked"
        else:
            self._start_generator(features.max_staleness, features.tools, features.where)
        log.info("grpo trainer paths: %s", "; ".join(f"{k} {v}" for k, v in self.paths.items()))

    def _path(self, name: str, asked: bool, refusal: str | None) -> bool:
        self.paths[name] = "off: not asked" if not asked else f"off: {refusal}" if refusal else "on"
        return self.paths[name] == "on"

    def _start_generator(self, max_staleness: int, tools: list | None, where: str) -> None:
        import torch
        from transformers import TrainerCallback

        if self.loop is None:  # what the recipe asks is refused at validate time (r1kit.stages.grpo.check_async): the model's own
            raise RecipeError(f"{where}max_staleness: asynchronous generation runs r1kit's decoding loop, which cannot stand in "
                              f"here ({self.paths['r1kit_decoding_loop'].removeprefix('off: ')}, from the model's generation "
                              "config or the trainer's); leave max_staleness out")
        if self.accelerator.num_processes > 1:
            raise RecipeError(f"{where}max_staleness: asynchronous generation runs on one process, not "
                              f"{self.accelerator.num_processes}; launch one, or leave max_staleness out")
        threads, left = async_generation.split_cores()
        torch.set_num_threads(left)
        model = self.accelerator.unwrap_model(self.model)
        self.generator = async_generation.Generator(
            model, max_staleness=max_staleness, temperature=self.args.temperature, top_p=self.args.top_p,
            eos_ids=set(self.eos_token_ids), pad_id=self._tokenizer.pad_token_id,
            bf16=bool(self.args.bf16) and self.accelerator.device.type == "cpu", threads=threads,
            seed=self.args.seed, tools=[t.config.__dict__ for t in tools] if tools else None,
            tokenizer=self.processing_class if tools else None)
        if tools:  # the prompts as the rollout function reads them (TRL's rollout_func path)
            tokenize = lambda prompts: self.processing_class(text=prompts)["input_ids"]  # noqa: E731
            self.rollout_func = self._drawn_rollouts
        else:
            tokenize = lambda prompts: self._tokenize_prompts(prompts)[0]  # noqa: E731
        self.feed = async_generation.Feed(self.generator, tokenize, self.max_completion_length)
        if self.vllm_importance_sampling_correction:
            self.use_vllm = True  # TRL's importance-sampling correction, for the generator's samples
            correction = f"TRL's importance sampling ({self.vllm_importance_sampling_mode})"
        else:
            correction = "PPO clip to the sampling policy"
        self.paths["async_generation"] = (f"on: at most {max_staleness} steps ahead, {threads} of {threads + left} cores, "
                                          f"{correction}")
        trainer = self

        class Publish(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                trainer.generator.publish(model, state.global_step)

            def on_train_end(self, args, state, control, **kwargs):
                trainer.generator.close()  # its cores back before the model is saved (the stage closes it on errors)

        self.add_callback(Publish())
        self._published = False

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if self.feed is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        if not self._published:  # the weights a resumed run starts from are loaded by now
            self.generator.publish(self.accelerator.unwrap_model(self.model), self.state.global_step)
            self._published = True
        batches = self.feed.next_step(epoch_iterator, num_batches, self.state.global_step)
        return batches, self._get_num_items_in_batch(batches, device)

    def _drawn_rollouts(self, prompts, trainer):
        """TRL's ``rollout_func`` with tools and asynchronous rollouts: the generator's turns."""
        ids = self.processing_class(text=prompts)["input_ids"]
        completions, logps, drawn = self._take_drawn(ids)
        for key, value in drawn.tool_figures.items():
            self._metrics["train"][key].append(value)
        return {"prompt_ids": ids, "completion_ids": completions, "logprobs": logps, "env_mask": drawn.masks}

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.generator is not None and self.model.training:
            return self._take_drawn(prompt_ids)[:2]
        if self.loop is None:
            with rollouts.generation_region(self):
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        prompts, counts = rollouts.groups(prompt_ids)
        return self.loop(prompts, counts, self.max_completion_length), None

    def _take_drawn(self, prompt_ids):
        """The generator's next batch, checked against this step's prompts, its figures logged."""
        drawn, waited = self.generator.take()
        if drawn.prompts != rollouts.groups(prompt_ids)[0]:
            raise RuntimeError("the rollout generator drew other prompts than this step's")
        metrics = self._metrics["train"]
        metrics["async/staleness"].append(float(self.state.global_step - drawn.version))
        metrics["async/dropped_share"].append(0.0)  # the generator waits for new enough weights
        metrics["async/trainer_wait_seconds"].append(waited)
        metrics["async/generator_wait_seconds"].append(drawn.waited)
        metrics["async/generation_seconds"].append(drawn.seconds)
        return drawn.completions, drawn.logps, drawn

    def _compute_loss(self, model, inputs):
        if not self.skipping:
            return self._loss(model, inputs)
        return zero_advantage.loss(self, self._loss, model, inputs)

    def _loss(self, model, inputs):
        """TRL's loss; with asynchronous rollouts clipped to the sampling policy, the ratio's figures
        are taken from its forward pass (`_get_per_token_logps_and_entropies`)."""
        self._ratio_rows = inputs if self.generator is not None and not self.use_vllm and model.training else None
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._ratio_rows = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **extra):
        one_pass = super()._get_per_token_logps_and_entropies
        if not self.sharing:
            out = one_pass(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **extra)
        else:
            out = shared_prompts.scores(self, one_pass, self._unfit, model, input_ids, attention_mask, logits_to_keep, batch_size,
                                        compute_entropy, compute_aux_loss, **extra)
        rows = self._ratio_rows
        if rows is not None and out[0].shape == rows["old_per_token_logps"].shape:
            for key, value in async_generation.ratio_figures(out[0].detach(), rows, self.epsilon_low, self.epsilon_high).items():
                self._metrics["train"][key].append(value)
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.dynamic is not None:
            self.dynamic.rewards = rewards  # (all processes' rows, functions): the refill reads its groups'
        return rewards

    def _generate_and_score_completions(self, inputs):
        self.batch_rows = inputs  # the rows of the prompts a rollout function gets (gym-style environments reset from them)
        batch = super()._generate_and_score_completions(inputs)
        if self.generator is not None and self.model.training:
            if self.use_vllm:  # TRL's importance-sampling correction: TRL logs the ratio, r1kit the share it bounds
                self._metrics["train"]["async/corrected_share"].append(async_generation.outside_share(
                    batch, self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min,
                    self.vllm_importance_sampling_clip_max))
            else:  # PPO's ratio taken to the policy that drew the samples
                batch["old_per_token_logps"] = batch["sampling_per_token_logps"]
        if self.dynamic is None or not self.model.training:
            return batch
        return self.dynamic.refill(self, batch, super()._generate_and_score_completions)


class DistillationTrainer(trl.DistillationTrainer):
    """TRL's DistillationTrainer whose student samples come from r1kit's decoding loop where it may
    stand in (``paths["r1kit_decoding_loop"]``): several times faster than ``model.generate`` on a
    CPU, from the same distribution."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _require(self, "DistillationTrainer")
        self.loop, decoding = _loop_path(self)
        self.paths = {"r1kit_decoding_loop": decoding}
        log.info("distillation trainer paths: r1kit_decoding_loop %s", decoding)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, has_tool_images=False):
        if self.loop is None:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, has_tool_images)
        return self.loop(prompt_ids, [1] * len(prompt_ids), self.max_completion_length)  # TRL's: the ids alone
