"""Multi-turn rollouts against one turn: what r1kit's turn loop costs when rollouts talk to an
environment, measured side by side in one run.

    python bench/environments.py                       # the offline tiny model, 64 rollouts, 4 turns of 32 tokens
    python bench/environments.py --model M --rollouts 32 --turns 8 --turn-tokens 64 --repeats 3

Both sides generate the same tokens with r1kit's decoding loop (r1kit.sampling.decode) on the same
model, prompts and sampling parameters (temperature 1, top-p 1):

- multi-turn: the rollouts run through r1kit's turn loop (r1kit.sampling.tool_loop) with an
  environment as its world (r1kit.environments.episodes.Episodes): every rollout's turn is
  `--turn-tokens` long, its environment (``step``) answers it, the answer is rendered by the chat
  template and appended, and the next turn goes on from each rollout's cached keys and values
  (r1kit.sampling.decode.Step's session), prefilling what was appended only; `--turns` turns;
- one turn: the same rollouts generate `--turns` x `--turn-tokens` tokens in one go.

The end-of-sequence token is left out of both (every turn then has its full length, so the two
sides generate the same number of tokens), and the world answers a turn that reached its token
budget as it answers one that ended at its end-of-turn token. Prints each side's seconds and
tokens per second (best of --repeats, the two sides taking turns) and the ratio multi-turn / one turn (the target: at
most 1.3); then how many tokens the environment's replies added (prefilled, not generated: the
one-turn side has none) and the ratio of time per token processed, replies included.

Not measured: served backends (their turns are requests: concurrency, not this loop, decides
them), environment calls that take time (the bench's environment answers at once; calls of one
turn run concurrently in any case), vLLM.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from r1kit.environments import EnvironmentConfig, load
from r1kit.environments.episodes import Episodes
from r1kit.hardware import cpu
from r1kit.hardware.precision import describe_cpu
from r1kit.sampling import tool_loop
from r1kit.sampling import decode as decoding
from r1kit.sampling.draws import Nucleus


class Echo:
    """Answers every turn with the same short line."""

    def reset(self, **row):
        return None

    def step(self, text: str) -> str | None:
        return "Go on."


class EveryTurn(Episodes):
    """The environment's world, answering a turn cut at its token budget as one that ended."""

    def _reply(self, transcript, tokens, how):
        return super()._reply(transcript, tokens, "eos" if how == "stop" else how)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the offline tiny model, built here)")
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cpu.keep_freed_memory()
    model_dir = args.model
    if model_dir is None:
        from r1kit.offline.tiny import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="r1kit-bench-env-")))
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    draw = Nucleus(1.0, 1.0).draw
    spec = load(EnvironmentConfig(name="__main__:Echo", max_turns=args.turns, turn_tokens=args.turn_tokens), "environment")
    rows = [{"id": i} for i in range(args.rollouts)]
    questions = [f"Count with me from {i}." for i in range(args.rollouts)]

    step = decoding.Step(model, draw, set(), pad)

    def multi_turn():
        world = EveryTurn([spec], tok)
        world.start(rows, questions, "plain")
        room = args.turns * args.turn_tokens + 64 * args.turns  # the environment's replies fit beside the turns
        out = tool_loop.rollouts(step, world.prompts, [1] * args.rollouts, room, world, tok, set())
        assert all(t.turns == args.turns for t in out), "a rollout ended early"
        return out

    def one_turn(prompts):
        return step(prompts, [1] * args.rollouts, args.turns * args.turn_tokens)

    first = EveryTurn([spec], tok)
    first.start(rows, questions, "plain")
    sides = {"one turn": lambda: one_turn(first.prompts), "multi-turn": multi_turn}
    results: dict[str, tuple[float, int]] = {}
    with torch.no_grad(), cpu.packed_linears(model, args.rollouts):
        for run in sides.values():
            run()  # warm-up
        for r in range(args.repeats):  # the sides take turns, so that a slow spell of the machine hits both
            for name, run in sides.items():
                torch.manual_seed(args.seed + r)
                t0 = time.perf_counter()
                out = run()
                seconds = time.perf_counter() - t0
                tokens = sum(sum(t.mask) for t in out) if name == "multi-turn" else sum(map(len, out))
                results[name] = min(results.get(name, (seconds, tokens)), (seconds, tokens))
                if name == "multi-turn":
                    written = sum(len(t.mask) - sum(t.mask) for t in out)  # the environment's replies, prefilled
    print(f"machine: {describe_cpu()}, {torch.get_num_threads()} threads; model {model_dir}")
    print(f"{args.rollouts} rollouts, {args.turns} turns of {args.turn_tokens} tokens (multi-turn) or {args.turns * args.turn_tokens} tokens in one turn")
    for name, (seconds, tokens) in results.items():
        print(f"{name:>10}: {seconds:7.3f} s, {tokens} tokens, {tokens / seconds:8.0f} tokens/s")
    ratio = results["multi-turn"][0] / results["one turn"][0]
    print(f"ratio multi-turn / one turn: {ratio:.2f} (target: at most 1.3)")
    (seconds, tokens), (alone, _) = results["multi-turn"], results["one turn"]
    print(f"the environment's replies: {written} tokens prefilled beside the {tokens} generated; time per token the model "
          f"processed, multi-turn / one turn: {seconds / (tokens + written) / (alone / tokens):.2f}")


if __name__ == "__main__":
    main()
