"""Benchmark: math_accuracy on Math-Verify's own public test cases, in the R1 answer format.

    python bench/math_verify_cases.py                   # fetches the math-verify sdist with pip
    python bench/math_verify_cases.py --tests DIR       # a math-verify source tree's tests/ folder

Math-Verify's repository tests its grader on (gold, prediction, expected verdict) cases written
from real model outputs. This bench reads those cases from the tests of the installed
math-verify version's source distribution (nothing of them is kept in r1kit), wraps each
prediction as an R1 answer (``<think>…</think> <answer>PRED</answer>``), scores it with
``math_accuracy`` against the gold as the reference answer, and counts agreement with the
expected verdict. Beside it, the same count for plain math-verify with its default
configuration (``verify(parse(gold), parse(pred))``), which is what most reward scripts call.
Many cases were written for a non-default configuration (expression-only extraction, 5-digit
precision, non-strict symbols); both counts use each side's defaults all the same. The cases
r1kit disagrees on are listed with its verdict and math-verify's.

Cases whose values are not literals in the test files (computed in Python) are skipped and
counted. It measures agreement with Math-Verify's expected verdicts, not with human graders.
"""

from __future__ import annotations

import argparse
import ast
import logging
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path


def fetch_tests(into: Path) -> Path:
    """The tests/ folder of the installed math-verify version's sdist, downloaded with pip."""
    wanted = version("math-verify")
    cmd = [sys.executable, "-m", "pip", "download", f"math-verify=={wanted}", "--no-binary", ":all:", "--no-deps", "-q", "-d", str(into)]
    subprocess.run(cmd, check=True)
    archive = next(into.glob("math_verify-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return next(into.glob("math_verify-*/tests"))


def cases(tests: Path) -> tuple[list[tuple[str, str, str, bool]], int]:
    """(where, gold, pred, expected) of every parametrized case named gold, pred and
    expected/result in the test files; and how many were skipped as not literal."""
    out, skipped = [], 0
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize" and len(dec.args) >= 2):
                    continue
                try:
                    names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
                except ValueError:
                    continue
                verdict = next((n for n in ("expected", "result") if n in names), None)
                if names[:2] != ["gold", "pred"] or verdict is None or not isinstance(dec.args[1], (ast.List, ast.Tuple)):
                    continue
                for element in dec.args[1].elts:
                    try:
                        row = dict(zip(names, ast.literal_eval(element)))
                    except ValueError:
                        skipped += 1
                        continue
                    out.append((f"{path.name}::{node.name}", row["gold"], row["pred"], bool(row[verdict])))
    return out, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tests", type=Path, help="a math-verify tests/ folder (default: fetch the sdist with pip)")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("r1kit.rewards.math").setLevel(logging.CRITICAL)

    from math_verify import parse, verify

    from r1kit.rewards.math import math_accuracy

    with tempfile.TemporaryDirectory() as tmp:
        tests = args.tests or fetch_tests(Path(tmp))
        found, skipped = cases(tests)
    ours = math_accuracy([f"<think>…</think> <answer>{pred}</answer>" for _, _, pred, _ in found], answer=[gold for _, gold, _, _ in found])
    theirs = []
    for _, gold, pred, _ in found:
        try:
            theirs.append(bool(verify(parse(gold), parse(pred))))
        except Exception:  # noqa: BLE001 - a crash is a wrong verdict for this count
            theirs.append(False)
    n = len(found)
    agree_ours = sum((o == 1.0) == e for o, (*_, e) in zip(ours, found))
    agree_theirs = sum(t == e for t, (*_, e) in zip(theirs, found))
    print(f"math-verify {version('math-verify')} test cases: {n} (skipped, not literal: {skipped})")
    print(f"math_accuracy, R1 answer format: {agree_ours}/{n} agree with the expected verdict")
    print(f"math-verify default parse + verify: {agree_theirs}/{n}")
    print("\ncases math_accuracy disagrees on (expected, math_accuracy, math-verify default):")
    for (where, gold, pred, expected), o, t in zip(found, ours, theirs):
        if (o == 1.0) != expected:
            print(f"  {where}: gold {gold!r} pred {pred!r}: expected {int(expected)}, r1kit {o}, math-verify {int(t)}")


if __name__ == "__main__":
    main()
