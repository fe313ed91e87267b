"""Synthetic reasoning tasks that r1kit generates offline, for tests and CPU demos.

A recipe uses one as a data source: ``data: {source: "task:addition", split: test, task: {digits: 3}}``.
Rows carry ``id``, ``prompt``, a worked ``completion`` in the R1 format (``<think> … </think>
<answer> … </answer>``), the same as ``messages``, the domain in ``task`` (``math`` or ``code``, for
routing rewards with ``when: {task: ...}``) and what the verifiers read: ``answer`` for math
(math_accuracy), ``tests`` for code (code_tests). One task feeds SFT, GRPO, rejection sampling and
evaluation alike.

Math: `addition`: multi-digit addition, with a chain of thought that adds column by column with
carries. `chain`: the sum of several one-digit numbers, with a running-sum chain of thought.
`last_digit`: the last digit of a left-to-right chain of `+` and `*` on one-digit numbers (the
demo's task: one step at a time it is easy, in one go it is not). `multiply`: products of two
multi-digit numbers, worked by one call of the python tool (r1kit.execution.tools).
Code: `functions`: write ``f(x) = (a*x+b) % 10`` from two of its values; the tests also check it
at points the prompt does not show.
Games: `guess`: episodes of the ``guess`` environment (r1kit.environments.guess), or cold-start
turns of played games (``demos: true``).
`mix`: several tasks in one shuffled dataset, ``{last_digit: {n: 1000}, functions: {n: 500}}``.
Each task takes `direct`, the share of demonstrations that answer with an empty chain of thought.
The split is a pure function of the problem (a hash), so train and test never share a problem,
whatever `n` and `seed` are.

Not here: real benchmarks (they load from the hub or local files, see r1kit.data).
"""

from __future__ import annotations

import inspect
import hashlib
import random


def _is_test(key: str) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5 == 0


def _rows(
    name: str, variant: int, draw, n: int, split: str, seed: int, direct: float, space: str, tests=None
) -> list[dict]:
    """`n` distinct problems of task `name` from `split`; `draw(rng)` gives one as (key, prompt,
    working, answer).

    The key decides the split; `direct` is the share of demonstrations with an empty chain of
    thought; `space` names the problems for the error when `n` is more than there are. A code
    task gives `tests(key)`: its rows carry those tests, and the answer is the program."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    if not 0.0 <= direct <= 1.0:
        raise ValueError(f"direct must be between 0 and 1, got {direct!r}")
    rng = random.Random(f"{name}-{variant}-{split}-{seed}")
    rows, seen, attempts = [], set(), 0
    while len(rows) < n:
        attempts += 1
        if attempts > 100 * n + 10_000:
            raise ValueError(f"n={n} is more than the distinct {space} in split {split!r}")
        key, prompt, working, answer = draw(rng)
        if key in seen or _is_test(key) != (split == "test"):
            continue
        seen.add(key)
        if direct and rng.random() < direct:
            working = ""
        completion = f"<think>{' ' + working if working else ''} </think> <answer> {answer} </answer>"
        # Every row has both verifier columns (None where they do not apply), so that mixed tasks
        # make one table whatever row comes first.
        checks = {"task": "math", "answer": str(answer), "tests": None} if tests is None else {"task": "code", "answer": None, "tests": tests(key)}
        rows.append(
            {
                "id": f"{name}-{split}-{len(rows)}",
                "prompt": prompt,
                **checks,
                "completion": completion,
                "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
            }
        )
    return rows


def addition_cot(a: int, b: int) -> str:
    """Column-by-column addition with carries, least significant digit first."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry, digits = [], 0, []
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s}" if carry else f"{x}+{y}={s}")
        digits.append(s % 10)
        carry = s // 10
    if carry:
        digits.append(carry)
    result = "".join(str(d) for d in reversed(digits))
    return f"{' , '.join(steps)} . so {a}+{b}={result}"


def addition(n: int = 1000, digits: int = 3, split: str = "train", seed: int = 0, direct: float = 0.0) -> list[dict]:
    """`n` addition problems of up to `digits`-digit numbers from `split` (train or test)."""
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1

    def draw(rng):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return f"{a}+{b}", f"What is {a} + {b}?", addition_cot(a, b), a + b

    return _rows("addition", digits, draw, n, split, seed, direct, f"{digits}-digit problems")


def chain(n: int = 1000, terms: int = 3, split: str = "train", seed: int = 0, direct: float = 0.0) -> list[dict]:
    """`n` sums of `terms` one-digit numbers from `split`, with a running-sum chain of thought.

    `direct` is the share of rows whose demonstration answers without working (an empty
    ``<think> </think>``), as R1's SFT data answers simple queries without a chain of thought.
    """

    def draw(rng):
        xs = [rng.randint(0, 9) for _ in range(terms)]
        steps, total = [], xs[0]
        for x in xs[1:]:
            steps.append(f"{total}+{x}={total + x}")
            total += x
        return "+".join(map(str, xs)), f"What is {' + '.join(map(str, xs))}?", " , ".join(steps), total

    return _rows("chain", terms, draw, n, split, seed, direct, f"{terms}-term sums")


def chain_of_digits(rng: random.Random, terms: int, ops: str) -> tuple[str, str, list[tuple[int, str, int, int]], int]:
    """One `last_digit` problem drawn from `rng`: its key (which decides its split), the expression
    ``((7 + 6) * 3) + 5``, the steps as (left, op, right, result), each left the last digit of the
    result before it, and the answer (the last digit). r1kit.offline.corpus draws its puzzles here too."""
    xs = [rng.randint(0, 9) for _ in range(terms)]
    chosen = [rng.choice(ops) for _ in range(terms - 1)]
    expr, steps, value = str(xs[0]), [], xs[0]
    for i, (op, x) in enumerate(zip(chosen, xs[1:])):
        result = value + x if op == "+" else value * x
        steps.append((value, op, x, result))
        value = result % 10
        expr = f"{expr} {op} {x}" if i == terms - 2 else f"({expr} {op} {x})"
    return str(xs[0]) + "".join(f"{o}{x}" for o, x in zip(chosen, xs[1:])), expr, steps, value


def last_digit(
    n: int = 1000, terms: int = 4, split: str = "train", seed: int = 0, direct: float = 0.0, ops: str = "+*"
) -> list[dict]:
    """`n` left-to-right chains of `+` and `*` on one-digit numbers, keeping the last digit.

    ``What is the last digit of ((7 + 6) * 3) + 5?`` → ``<think> 7+6=13 , 3*3=9 , 9+5=14 </think>
    <answer> 4 </answer>``: each step is a one-digit fact, while the answer in one go composes
    `terms - 1` non-commuting operations. `direct` is as in `chain`. `ops` are the operations
    drawn from ("+" alone: sums, whose last digits are spread evenly; with "*" a quarter of the
    answers are 0). A problem is in the same split whatever `ops` is.
    """
    if not ops or set(ops) - set("+*") or len(set(ops)) != len(ops):
        raise ValueError(f"ops must be '+', '*' or '+*', got {ops!r}")

    def draw(rng):
        key, expr, steps, value = chain_of_digits(rng, terms, ops)
        return key, f"What is the last digit of {expr}?", " , ".join(f"{a}{op}{b}={r}" for a, op, b, r in steps), value

    return _rows("last_digit", terms if ops == "+*" else f"{terms}{ops}", draw, n, split, seed, direct, f"{terms}-term chains of {ops}")


def chain_sum(n: int = 1000, terms: int = 4, split: str = "train", seed: int = 0, direct: float = 0.0, pairs: bool = False) -> list[dict]:
    """`n` of reasoning-gym's ``chain_sum`` problems (sums and differences of `terms` one-digit
    numbers: its questions, answers and ``reasoning_gym`` column, so its own scorer judges them),
    with worked demonstrations, a cold start for training on ``reasoning_gym:chain_sum``:

    ``State the final answer to the following arithmetic problem: 4 - 1 - 7 =`` → ``<think> 4-1=3
    , 3-7=-4 </think> <answer> -4 </answer>``. `direct` is as in `chain`. The problems are
    reasoning-gym's with seed `seed` (``test``: another seed); the space of 4 terms holds 80,000,
    so a few hundred benchmark problems (seed 1) share a handful with 2,000 of these.

    With `pairs`, preference pairs for a reward model (the ``reward`` stage) instead: ``chosen``,
    the worked demonstration (``direct`` unused), and ``rejected``, a wrong response that is
    shorter, as in much preference data: half the time a working that leaves out one term (the
    wrong total it reaches), else a wrong answer with no working. A reward model can rank these
    by how much was written as well as by whether the sum is right."""
    from r1kit.environments import reasoning_gym

    if not 0.0 <= direct <= 1.0:
        raise ValueError(f"direct must be between 0 and 1, got {direct!r}")
    settings = {"size": n, "min_terms": terms, "max_terms": terms, "min_digits": 1, "max_digits": 1}
    rng = random.Random(f"chain_sum-{terms}-{split}-{seed}")
    rows = reasoning_gym.rows("chain_sum", settings, seed=seed if split == "train" else seed + 1_000_003)
    for row in rows:
        words = row["prompt"].rsplit(":", 1)[1].replace("=", "").split()  # "4 - 1 - 7"
        steps, _ = _worked(words)
        if pairs:
            row.update(chosen=f"<think> {' , '.join(steps)} </think> <answer> {row['answer']} </answer>", rejected=_shorter(words, rng))
            continue
        working = "" if direct and rng.random() < direct else " " + " , ".join(steps)
        completion = f"<think>{working} </think> <answer> {row['answer']} </answer>"
        row.update(completion=completion, messages=[{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": completion}])
    return rows


def _worked(words: list[str]) -> tuple[list[str], int]:
    """The steps (``4-1=3``) and the total of the sum `words` (``["4", "-", "1", "-", "7"]``)."""
    total, steps = int(words[0]), []
    for op, x in zip(words[1::2], words[2::2]):
        result = total + int(x) if op == "+" else total - int(x)
        steps.append(f"{total}{op}{x}={result}")
        total = result
    return steps, total


def _shorter(words: list[str], rng: random.Random) -> str:
    """A wrong response to the sum `words`, shorter than its working (`chain_sum`'s pairs)."""
    right = _worked(words)[1]
    if rng.random() < 0.5:  # a term left out
        skip = rng.randrange(1, len(words) // 2 + 1)
        steps, total = _worked(words[: 2 * skip - 1] + words[2 * skip + 1 :])
        if total != right:
            return f"<think> {' , '.join(steps)} </think> <answer> {total} </answer>"
    wrong = right + rng.choice([-3, -2, -1, 1, 2, 3])
    return f"<think> </think> <answer> {wrong} </answer>"


def multiply(n: int = 1000, digits: int = 3, split: str = "train", seed: int = 0, direct: float = 0.0) -> list[dict]:
    """`n` products of two `digits`-digit numbers from `split`, worked with the python tool.

    ``What is 487 * 362?`` → ``<think> ```python\\nprint(487 * 362)\\n```\\n```output\\n176294\\n```\\n
    </think> <answer> 176294 </answer>``: the demonstration runs one line of Python (r1kit.execution.tools)
    and restates what it printed. A small model cannot multiply such numbers in its head, and
    with the tool it only has to copy: the demo of tool-integrated reasoning. `direct` is the
    share of demonstrations that answer without the tool (an empty ``<think> </think>``)."""
    from r1kit.execution.tools import output_block

    lo, hi = 10 ** (digits - 1), 10**digits - 1

    def draw(rng):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return f"{a}*{b}", f"What is {a} * {b}?", f"```python\nprint({a} * {b})\n```\n{output_block(str(a * b))}", a * b

    return _rows("multiply", digits, draw, n, split, seed, direct, f"{digits}-digit products")


def functions(n: int = 1000, split: str = "train", seed: int = 0, direct: float = 0.0) -> list[dict]:
    """`n` problems "write f(x) = (a*x + b) % 10 from f(x1) and f(x1 + 1)", a in 1-9, b in 0-9, x1 in 0-99.

    ``Write f(x) = (a*x+b) % 10 with f(23) == 7 and f(24) == 2.`` → ``<think> 12-7=5 , 5*3=15 ,
    17-5=12 </think> <answer> def f(x): return (5*x+2)%10 </answer>``: a is the last digit of
    f(x1 + 1) - f(x1) (plus 10), b that of f(x1) - a * (the last digit of x1). Each step is a
    fact on digits of the kind `last_digit` practises; the program in one go needs all three. The
    tests assert the two given values and f at three points the prompt does not show.
    9,000 problems in all, a fifth of them in the test split. `direct` is as in `chain`.
    """

    def draw(rng):
        a, b, x = rng.randint(1, 9), rng.randint(0, 9), rng.randint(0, 99)
        y1, y2, p = (a * x + b) % 10, (a * x + a + b) % 10, a * (x % 10)
        # a and b are last digits of what each step gives, as the values of `last_digit` are.
        working = f"1{y2}-{y1}={10 + y2 - y1} , {a}*{x % 10}={p} , 1{y1}-{p % 10}={10 + y1 - p % 10}"
        prompt = f"Write f(x) = (a*x+b) % 10 with f({x}) == {y1} and f({x + 1}) == {y2}."
        return f"{a},{b},{x}", prompt, working, f"def f(x): return ({a}*x+{b})%10"

    def tests(key: str) -> str:
        a, b, x = map(int, key.split(","))
        # Three points the prompt does not show: a program that only knows the two values fails.
        return "".join(f"assert f({v}) == {(a * v + b) % 10}\n" for v in (x, x + 1, x + 2, x + 3, x + 7))

    return _rows("functions", 1, draw, n, split, seed, direct, "functions", tests)


def guess(n: int = 1000, split: str = "train", seed: int = 0, high: int = 8, guesses: int = 4, demos: bool = False,
          informed: float = 0.0) -> list[dict]:
    """`n` games of the ``guess`` environment (r1kit.environments.guess: find a secret number from
    1 to `high` in `guesses` calls, each answered higher, lower or correct) from `split`.

    Episode rows (GRPO, eval): ``prompt`` (the question), ``secret`` (which resets the game) and
    ``answer``. With `demos`, cold-start rows instead, one per turn of a played game: ``prompt``
    (the conversation so far), ``completion`` (the turn: a tool call, or after ``correct`` a
    closing line) and ``tools`` (the game's tool, as JSON): SFT on them trains the turns, not the
    game's replies. The share `informed` of the demonstrated games halve the range: the first
    guess is the middle (``(1 + high) // 2``), each later one the middle of what the replies allow,
    which finds any secret within ``log2(high) + 1`` guesses. The others count up from 1 whatever
    the replies say (1, 2, 3, ...): the first guess tells the two apart, and counting finds the
    secret only when it is among the first `guesses` numbers (half the games of 1..8 in four
    guesses). Both ways are fixed given the first guess, so a small model learns each. The split hashes the game's key (secret
    and draw), so a test game never repeats a training game's key; with few secrets the same
    secret appears in both."""
    import json

    from transformers.utils import get_json_schema

    from r1kit.environments.guess import Guess

    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    tool = get_json_schema(Guess.guess)
    question = f"Find the secret number from 1 to {high}."
    rng = random.Random(f"guess-{split}-{seed}")
    rows, index = [], 0
    while len(rows) < n:
        secret, index = rng.randint(1, high), index + 1
        if _is_test(f"guess-{seed}-{index}") != (split == "test"):
            continue
        if not demos:
            rows.append({"id": f"guess-{split}-{len(rows)}", "prompt": question, "secret": secret, "answer": str(secret), "task": "game"})
            continue
        game, low, top = Guess(1, high, guesses), 1, high
        game.reset(secret=secret)
        conversation = [{"role": "user", "content": question}]
        halving = rng.random() < informed
        for turn in range(guesses):
            number = (low + top) // 2 if halving else turn + 1
            call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "guess", "arguments": {"number": number}}}]}
            rows.append({"id": f"guess-{split}-{len(rows)}", "prompt": list(conversation), "completion": [call], "tools": json.dumps([tool])})
            reply = game.guess(number)
            conversation += [call, {"role": "tool", "name": "guess", "content": reply}]
            low, top = (number + 1, top) if reply == "higher" else (low, number - 1) if reply == "lower" else (low, top)
            if reply == "correct":
                done = {"role": "assistant", "content": f"Found it: {number}."}
                rows.append({"id": f"guess-{split}-{len(rows)}", "prompt": list(conversation), "completion": [done], "tools": json.dumps([tool])})
                break
    return rows[:n]


def mix(split: str = "train", seed: int = 0, **parts: dict) -> list[dict]:
    """The rows of several tasks, shuffled together: ``mix(last_digit={"n": 100}, functions={"n": 50})``."""
    if not parts or "mix" in parts:
        raise ValueError("mix takes the tasks to mix and their arguments, e.g. {last_digit: {n: 100}, functions: {n: 50}}")
    rows = []
    for name, args in parts.items():
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r} to mix; tasks: {', '.join(t for t in TASKS if t != 'mix')}")
        if not isinstance(args, dict):
            raise ValueError(f"the arguments of {name} are a mapping, e.g. {{n: 100}}; got {args!r}")
        rows += TASKS[name](split=split, **{"seed": seed, **args})
    random.Random(f"mix-{split}-{seed}").shuffle(rows)
    return rows


TASKS = {"addition": addition, "chain": chain, "chain_sum": chain_sum, "last_digit": last_digit, "multiply": multiply, "functions": functions, "guess": guess,
         "mix": mix}


def check(name: str, args: dict) -> None:
    """Refuse an unknown task, or arguments its generator does not take (nothing is generated)."""

    from r1kit.errors import DataError, suggest

    if name not in TASKS:
        raise DataError(f"task:{name}: unknown task{suggest(name, list(TASKS))}; tasks: {', '.join(TASKS)}")
    if name == "mix":
        for part, part_args in args.items():
            if part in ("seed", "split"):
                continue
            if part not in TASKS or part == "mix" or not isinstance(part_args, dict):
                raise DataError(f"task:mix: {part!r} is not a task to mix with a mapping of its arguments; tasks: {', '.join(t for t in TASKS if t != 'mix')}")
            check(part, part_args)
        return
    try:
        inspect.signature(TASKS[name]).bind(**args)
    except TypeError as exc:
        taken = [p for p in inspect.signature(TASKS[name]).parameters if p != "split"]
        raise DataError(f"task:{name}: {exc}; it takes {', '.join(taken)}") from None
    for key in ("n", "digits", "terms"):  # counts: none of them may be empty
        value = args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise DataError(f"task:{name}: {key} must be a whole number of at least 1, got {value!r}")


def arguments(name: str, args: dict) -> dict:
    """Every argument that decides the problems of benchmark ``task:NAME`` (always its test split),
    the task's defaults filled in (for mix: its own seed; each part's arguments as given)."""
    from r1kit.errors import DataError

    if "split" in args:
        raise DataError(f"task:{name}: split: a task benchmark is always the task's test split; remove it")
    check(name, args)
    bound = inspect.signature(TASKS[name]).bind_partial(**args)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k not in ("split", "parts")} | bound.arguments.get("parts", {})


def generate(name: str, split: str, args: dict) -> list[dict]:
    from r1kit.errors import DataError

    if name not in TASKS:
        raise DataError(f"task:{name}: unknown task; tasks: {', '.join(TASKS)}")
    try:
        return TASKS[name](split=split, **args)
    except (TypeError, ValueError) as exc:
        raise DataError(f"task:{name}: {exc}") from None
