"""Tool-integrated reasoning: the protocol by which a rollout runs code while it reasons, and the
tools it may call.

A rollout writes a fenced block in a tool's language, as ToRL and SimpleTIR do::

    <think> 487 * 36 is hard in the head.
    ```python
    print(487 * 36)
    ```
    ```output
    17532
    ```
    so the answer is 17532 </think> <answer> 17532 </answer>

Generation stops at the block's closing fence (a line holding only three backticks, its newline
included). r1kit runs the block and appends what it printed as an ``output`` block: stdout,
then the last line of the error where the block failed (``ZeroDivisionError: division by zero``),
cut at ``output_chars`` with a marker; then generation goes on. Blocks of one rollout share state
as notebook cells do: a block runs after the rollout's earlier blocks (their output discarded),
so later blocks see earlier definitions. A block whose last statement is an expression shows its
value, as in a notebook. The loop that does the turns is r1kit.sampling.tool_loop.

Bounds, each set in the recipe (``tools: [{name: python, calls: 2}]``) and checked when it is read:
``calls`` per rollout (ToRL's call cap: past it a rollout's blocks are not run and it goes on in
text), ``timeout`` seconds and ``memory_mb`` per call, ``output_chars`` of output shown; the
rollout's whole length, tool output included, stays within the stage's completion budget.

A tool is a plain batch function, found by name like a reward: the built-in ``python``, an entry
point of the ``r1kit.tools`` group, or a ``module:function`` string::

    def my_tool(blocks: list[str], history: list[list[str]], config: ToolConfig) -> list[ToolOutput]
    my_tool.language = "sql"        # the fence it answers: ```sql

`blocks[i]` is one rollout's new block and `history[i]` that rollout's earlier blocks.

What the python tool does not protect against is what r1kit.execution.sandbox does not: every block runs
there (no network, a uid of its own, no process left behind, limits on time, memory, processes
and output); a hostile block gets an error output, never a crash of the stage.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any, Callable

from r1kit.execution import sandbox
from r1kit.errors import RecipeError
from r1kit.text import OUTPUT_FENCE

ENTRY_POINT_GROUP = "r1kit.tools"
CLOSE = "\n```\n"
TRUNCATED = "... (output cut at {n} characters)"


@dataclass(kw_only=True)
class ToolConfig:
    """A tool a rollout may call, and its bounds."""

    name: str
    """The tool: ``python``, a ``r1kit.tools`` entry point, or ``module:function``."""
    calls: int = 4
    """Tool calls per rollout; past them a rollout's blocks are not run (ToRL's call cap C)."""
    timeout: float = 5.0
    """Wall-clock and CPU seconds per call (the whole notebook replay)."""
    memory_mb: int = 1024
    """Address space per call, in MiB."""
    output_chars: int = 512
    """Characters of a call's output shown to the model; more is cut with a marker."""

    def problem(self) -> str | None:
        """What is wrong with these bounds, in one line, or None."""
        for key in ("calls", "timeout", "memory_mb", "output_chars"):
            value = getattr(self, key)
            if isinstance(value, bool) or not value > 0:
                return f"{key} must be above 0; got {value!r}"
        return None


@dataclass
class ToolOutput:
    """What one call gave back."""

    text: str
    """The output block's content, as the model reads it."""
    ok: bool
    """The block ran to its end."""
    timed_out: bool = False
    seconds: float = 0.0


ToolFn = Callable[[list[str], list[list[str]], ToolConfig], list[ToolOutput]]


class Tool:
    """A configured tool: its function, its fence and its bounds."""

    def __init__(self, config: ToolConfig, where: str = "tools"):
        from r1kit.errors import RewardError
        from r1kit.reward_registry import load_plugin

        self.config = config
        try:
            self.fn: ToolFn = load_plugin(config.name, ENTRY_POINT_GROUP, "tool")
        except RewardError as exc:
            raise RecipeError(f"{where}: {exc}") from None
        self.language = getattr(self.fn, "language", None)
        if not isinstance(self.language, str) or not re.fullmatch(r"[\w+-]+", self.language):
            raise RecipeError(f"{where}: tool {config.name!r} needs a `language` attribute naming its fence (e.g. 'python')")
        self.block = re.compile(rf"```{re.escape(self.language)}[ \t]*\n(.*?)\n?```[ \t]*\n", re.DOTALL)

    def find(self, text: str) -> str | None:
        """The code of the first complete block in `text` (one turn of a rollout), or None."""
        match = self.block.search(text)
        return None if match is None else match.group(1)

    def run(self, blocks: list[str], history: list[list[str]]) -> list[ToolOutput]:
        outputs = self.fn(blocks, history, self.config) if blocks else []
        for out in outputs:
            if len(out.text) > self.config.output_chars:
                out.text = out.text[: self.config.output_chars] + TRUNCATED.format(n=self.config.output_chars)
        return outputs


@dataclass(kw_only=True)
class ToolFields:
    """The ``tools`` setting of the stages that sample (grpo, rejection, eval)."""

    tools: list[Any] = field(default_factory=list)
    """Tools the rollouts may call (r1kit.execution.tools): names, or {name, calls, timeout, memory_mb, output_chars}."""

    def check_tools(self, where: str) -> None:
        """Refuse unknown tools and bad bounds, with one line naming `where`."""
        self.load_tools(where)

    def load_tools(self, where: str = "tools") -> list[Tool]:
        return [Tool(c, f"{where}[{i}]") for i, c in enumerate(from_recipe(self.tools, where))]


def from_recipe(specs: list, where: str) -> list[ToolConfig]:
    """Tool configs from a recipe's ``tools`` list: names, or mappings of a name and bounds (on
    the command line a YAML mapping in braces: ``--tools '{name: python, calls: 2}'``)."""
    import yaml

    from r1kit.config import from_dict, parse_yaml

    configs = []
    for i, spec in enumerate(specs):
        if isinstance(spec, str) and spec.lstrip().startswith("{"):
            try:
                spec = parse_yaml(spec)
            except yaml.YAMLError as exc:
                raise RecipeError(f"{where}[{i}]: {spec!r} is not a YAML mapping ({getattr(exc, 'problem', exc)}); "
                                  "write {name: python, calls: 2}") from None
        config = from_dict(ToolConfig, {"name": spec} if isinstance(spec, str) else spec, f"{where}[{i}]")
        problem = config.problem()
        if problem:
            raise RecipeError(f"{where}[{i}].{problem}")
        configs.append(config)
    return configs


def output_block(text: str) -> str:
    """The block appended after a call: ``output`` fence, the text, the closing fence."""
    return f"{OUTPUT_FENCE}{text.rstrip(chr(10))}{CLOSE}"


# ---- the python tool ---------------------------------------------------------------------------

# Run in the sandbox: the earlier cells (output discarded, errors ignored), then the new one,
# showing its last expression's value; an error prints its last line and fails the run.
_NOTEBOOK = """\
import ast as _ast, contextlib as _cl, io as _io, sys as _sys
_cells = {cells!r}
_g = {{"__name__": "__main__", "__builtins__": __builtins__}}
for _c in _cells[:-1]:
    try:
        with _cl.redirect_stdout(_io.StringIO()), _cl.redirect_stderr(_io.StringIO()):
            exec(compile(_c, "<cell>", "exec"), _g)
    except BaseException:
        pass
try:
    _tree = _ast.parse(_cells[-1], "<cell>")
    _last = _tree.body.pop() if _tree.body and isinstance(_tree.body[-1], _ast.Expr) else None
    exec(compile(_tree, "<cell>", "exec"), _g)
    if _last is not None:
        _value = eval(compile(_ast.Expression(_last.value), "<cell>", "eval"), _g)
        if _value is not None:
            print(repr(_value))
except BaseException as _e:
    _sys.stdout.flush()
    print(f"{{type(_e).__name__}}: {{_e}}".rstrip(": "), file=_sys.stderr)
    _sys.exit(1)
"""


def python(blocks: list[str], history: list[list[str]], config: ToolConfig) -> list[ToolOutput]:
    """Python blocks run in r1kit's sandbox as notebook cells (each after its rollout's earlier ones)."""
    # The clock is the bound; CPU time gets a second more, so a busy block meets the clock first.
    limits = sandbox.Limits(
        wall_s=config.timeout, cpu_s=config.timeout + 1, memory_mb=config.memory_mb, output_kb=max(4, config.output_chars // 256)
    )
    programs = [(_NOTEBOOK.format(cells=[*earlier, block]), "") for block, earlier in zip(blocks, history)]
    outputs = []
    for result in sandbox.run_many(programs, limits):
        text = result.stdout
        timed_out = result.timed_out or result.returncode == -signal.SIGXCPU
        if timed_out:
            text += f"TimeoutError: the block ran past {config.timeout:g} s"
        elif result.output_exceeded:
            text += TRUNCATED.format(n=len(text))
        elif not result.ok:
            lines = result.stderr.strip().splitlines()
            killed = f"killed by signal {signal.Signals(-result.returncode).name}" if result.returncode < 0 else ""
            text += lines[-1] if lines else killed or f"the block ended with exit status {result.returncode}"
        outputs.append(ToolOutput(text=text, ok=result.ok, timed_out=timed_out, seconds=result.wall_s))
    return outputs


python.language = "python"
