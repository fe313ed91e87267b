"""Multi-turn rollouts with tools: generate, run the code a turn ends on, append its output, go on
(the protocol and the tools are r1kit.execution.tools).

    transcripts = rollouts(step, prompts=[[1, 2, 3]], counts=[8], max_tokens=256,
                           tools=[Tool(ToolConfig(name="python"))], tokenizer=tokenizer, eos_ids={0})
    transcripts[0].ids, transcripts[0].mask   # the completion's tokens; 0 where a tool wrote them

Turns are synchronous: every sample generates until it ends, runs out of room, or closes a
code block; the blocks of the batch run in the sandbox together; the samples that called a tool
go on to the next turn after the output, and the others leave the batch.
`step(prompts, counts, max_tokens, stop)` is the engine: vLLM with the closing fence as a stop
string (each turn a prompt of its own: the prompt, the rollout so far and the output; vLLM's
prefix cache holds what came before), or r1kit's decoding loop (r1kit.sampling.decode.Step: its
``stop`` asked after each token), whose ``session(prompts, counts)`` keeps every rollout's keys
and values from one turn to the next, so that a turn prefills only what the world appended.

A rollout's tokens never exceed `max_tokens`, tool output included (an output that does not fit
is cut, and the rollout ends there, truncated). Past its tool's ``calls`` a rollout's blocks are
not run: it goes on in plain text, as ToRL does past its call cap.

Not here: training (r1kit.stages.grpo hands the mask to TRL as its tool mask), or scoring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from r1kit.execution.tools import CLOSE, Tool, output_block

# step(prompts, counts, max_tokens, stop) -> new tokens of each sample, prompt by prompt
Step = Callable[[list[list[int]], list[int], int, Callable[[int, list[int]], bool] | None], list[list[int]]]


@dataclass
class Transcript:
    """One rollout: the model's tokens and the tools' outputs, in order."""

    index: int = 0
    """The rollout's number among those of its call (r1kit.sampling.tool_loop.rollouts' `first` on)."""
    turns: int = 0
    """Turns the model generated."""
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    """1 where the model wrote the token, 0 where a tool's output did."""
    blocks: list[str] = field(default_factory=list)
    """The code each call ran, in order (the notebook's cells)."""
    calls: int = 0
    errors: int = 0
    """Calls whose block did not run to its end (timeouts included)."""
    timeouts: int = 0
    seconds: float = 0.0
    """Seconds in the sandbox."""


_NEWLINES: dict[int, tuple[object, frozenset[int]]] = {}


def _newline_tokens(tokenizer) -> frozenset[int]:
    """The token ids whose text holds a newline; the vocabulary is decoded once per tokenizer
    (a large one takes about a second), not at every rollout batch."""
    held = _NEWLINES.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:
        held = _NEWLINES[id(tokenizer)] = (tokenizer, frozenset(i for i in range(len(tokenizer)) if "\n" in tokenizer.decode([i])))
    return held[1]


class World(Protocol):
    """What answers a rollout between its turns: the fenced-code tools (`Fences`) or an
    environment's episodes (r1kit.environments.episodes.Episodes)."""

    stop_strings: list[str]
    """Text that ends a turn before the end of the sequence (a served engine's stop strings)."""
    turn_tokens: int | None
    """Most tokens of one turn; None: the rollout's room."""

    def stop(self, transcript: Transcript, tokens: list[int]) -> bool:
        """Whether the turn so far (`tokens`) ends here (r1kit's decoding loop asks after each token)."""
        ...

    def reply(self, turns: list[tuple[Transcript, list[int], str]]) -> list[list[int] | None]:
        """For each rollout whose turn ended (its transcript, the turn's tokens, how it ended:
        ``eos`` at the end of the sequence, ``stop`` where `stop` said or the turn's tokens ran
        out, ``cut`` where the rollout's room did): the tokens to append (written by the world:
        masked out), or None where the rollout ends (a ``cut`` rollout ends whatever the reply).
        Calls of one turn may run together."""
        ...


class Fences:
    """The world of fenced-code tools (r1kit.execution.tools): a turn stops at a block's closing
    fence, the block runs, its output block is the reply; a turn that ends the sequence ends the rollout."""

    turn_tokens = None
    stop_strings = [CLOSE]

    def __init__(self, tokenizer, tools: list[Tool]):
        self.tokenizer, self.tools = tokenizer, tools
        self.newline = _newline_tokens(tokenizer)
        self.calls_left = {t.config.name: t.config.calls for t in tools}

    def block(self, tokens: list[int]) -> tuple[Tool, str] | None:
        """The tool and code of the first complete block in a turn's tokens, or None."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        found = [(text.find(f"```{t.language}"), t, code) for t in self.tools if (code := t.find(text)) is not None]
        return min(found, key=lambda f: f[0])[1:] if found else None

    def _callable(self, transcript: Transcript, tokens: list[int]) -> tuple[Tool, str] | None:
        found = self.block(tokens)
        return found if found is not None and transcript.calls < self.calls_left[found[0].config.name] else None

    def stop(self, transcript: Transcript, tokens: list[int]) -> bool:
        return bool(tokens) and tokens[-1] in self.newline and self._callable(transcript, tokens) is not None

    def reply(self, turns):
        replies: list[list[int] | None] = [None] * len(turns)
        pending = [(k, t, *found) for k, (t, tokens, how) in enumerate(turns)
                   if how == "stop" and (found := self._callable(t, tokens)) is not None]
        for tool in self.tools:  # each tool runs its blocks of the turn as one batch
            mine = [(k, t, code) for k, t, used, code in pending if used is tool]
            results = tool.run([code for _, _, code in mine], [t.blocks for _, t, _ in mine])
            for (k, t, code), result in zip(mine, results):
                t.blocks.append(code)
                t.calls += 1
                t.errors += not result.ok
                t.timeouts += result.timed_out
                t.seconds += result.seconds
                replies[k] = self.tokenizer(output_block(result.text), add_special_tokens=False)["input_ids"]
        return replies


def stop_strings(tools) -> list[str]:
    """The stop strings a served engine ends the turns of `tools` at (a list of Tools or a World)."""
    return Fences.stop_strings if isinstance(tools, list) else tools.stop_strings


def rollouts(
    step: Step,
    prompts: list[list[int]],
    counts: list[int],
    max_tokens: int,
    tools: "list[Tool] | World",
    tokenizer,
    eos_ids: set[int],
    first: int = 0,
) -> list[Transcript]:
    """`counts[i]` rollouts of each prompt `prompts[i]` (token ids), prompt by prompt, each at
    most `max_tokens` tokens long with what the world wrote (see the module docstring). `tools`:
    fenced-code tools, or a World; `first` numbers the rollouts (``Transcript.index``) for a
    World that holds state per rollout."""
    world = Fences(tokenizer, tools) if isinstance(tools, list) else tools
    out = [Transcript(index=first + k) for k in range(sum(counts))]
    owner = [p for p, n in enumerate(counts) for _ in range(n)]  # each rollout's prompt
    live = list(range(len(out)))  # the rollouts of this turn, in the order step returns them
    turn_prompts, turn_counts, budget = prompts, counts, max_tokens
    session = step.session(prompts, counts) if hasattr(step, "session") else None

    while live:
        def stop(i: int, tokens: list[int]) -> bool:  # i: the rollout's place in this turn
            return world.stop(out[live[i]], tokens)

        turn_budget = budget if world.turn_tokens is None else min(budget, world.turn_tokens)
        new = session.generate(turn_budget, stop) if session else step(turn_prompts, turn_counts, turn_budget, stop)
        ended: list[tuple[int, list[int], str]] = []
        for r, tokens in zip(live, new):
            room = max_tokens - len(out[r].ids)
            tokens = tokens[:room]
            out[r].ids += tokens
            out[r].mask += [1] * len(tokens)
            out[r].turns += 1
            if tokens:
                ended.append((r, tokens, "cut" if len(out[r].ids) >= max_tokens else "eos" if tokens[-1] in eos_ids else "stop"))
        replies = world.reply([(out[r], tokens, how) for r, tokens, how in ended])
        place = {r: i for i, r in enumerate(live)}
        live, shown_all = [], []
        for (r, _, _), reply in zip(ended, replies):
            if reply is None:
                continue
            t = out[r]
            shown = reply[: max_tokens - len(t.ids)]
            t.ids += shown
            t.mask += [0] * len(shown)
            if len(t.ids) < max_tokens:
                live.append(r)
                shown_all.append(shown)
        if session and live:
            session.extend([place[r] for r in live], shown_all)
        turn_prompts = [prompts[owner[r]] + out[r].ids for r in live]
        turn_counts = [1] * len(live)
        budget = max((max_tokens - len(out[r].ids) for r in live), default=0)
    return out


def completions(step: Step, prompts, counts, max_tokens, tools, tokenizer, eos_ids, first: int = 0) -> list:
    """`rollouts` as the samplers return them: Completions of the whole transcripts, prompt by prompt."""
    from r1kit.sampling.base import Completion

    return [
        Completion(text=tokenizer.decode(t.ids, skip_special_tokens=True), tokens=sum(t.mask),
                   truncated=not t.ids or t.ids[-1] not in eos_ids, tool_calls=t.calls, turns=t.turns)
        for t in rollouts(step, prompts, counts, max_tokens, tools, tokenizer, eos_ids, first)
    ]


def metrics(transcripts: list[Transcript]) -> dict[str, float]:
    """Per-batch figures a tool-using run logs: calls per rollout, the share of rollouts that
    call a tool, errors and timeouts per call, seconds in the sandbox."""
    n = max(1, len(transcripts))
    calls = sum(t.calls for t in transcripts)
    return {
        "tools/calls_per_rollout": calls / n,
        "tools/call_share": sum(t.calls > 0 for t in transcripts) / n,
        "tools/error_share": sum(t.errors for t in transcripts) / max(1, calls),
        "tools/timeout_share": sum(t.timeouts for t in transcripts) / max(1, calls),
        "tools/sandbox_seconds": sum(t.seconds for t in transcripts),
    }
