"""Run under `accelerate launch` (tests/test_reward_model.py): every process loads the reward
model as the reward does inside a trainer that shards its own weights, under the loading
conditions of recipes/accelerate/fsdp.yaml (the environment flags accelerate sets for it) or of
zero3.yaml (transformers' DeepSpeed ZeRO-3 switch on), and writes what it got.

    python -m accelerate.commands.launch --config_file recipes/accelerate/cpu_ddp.yaml tests/rm_ranks.py RM OUT fsdp|zero3

`launch(rm, out, condition)` does that and returns the completed launch and each process's
record (scores, weight sum), or None for the records when the launch failed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def launch(rm: str, out: Path, condition: str) -> tuple[subprocess.CompletedProcess, list[dict] | None]:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if condition == "fsdp":  # what accelerate sets for recipes/accelerate/fsdp.yaml with rank-0 loading
        env |= {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(root / "recipes/accelerate/cpu_ddp.yaml"),
           str(Path(__file__).resolve()), rm, str(out), condition]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return done, None
    return done, [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in (0, 1)]


class ZeRO3:
    """What transformers asks of the DeepSpeed config object a ZeRO-3 trainer registers."""

    config = {"zero_optimization": {"stage": 3}}

    def is_zero3(self):
        return True


def main(rm: str, out: str, condition: str) -> None:
    dist.init_process_group("gloo")
    keep = None
    if condition == "zero3":
        from transformers.integrations.deepspeed import set_hf_deepspeed_config

        keep = ZeRO3()  # referenced here: transformers holds it weakly, as it holds the trainer's
        set_hf_deepspeed_config(keep)
    from r1kit.rewards.reward_model import load, reward_model

    scores = reward_model(["It is 42.", "<think> 40 + 2 </think> 41"], model=rm, prompt=["What is 40 + 2?"] * 2)
    _, model = load(rm)
    weights = float(sum(p.detach().abs().sum() for p in model.parameters()))
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps({"scores": scores, "weights": weights}))
    dist.barrier()
    dist.destroy_process_group()
    del keep


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:])
