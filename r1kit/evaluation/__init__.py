"""Evaluation: benchmarks (built-in tables, code benchmarks, Codeforces, multiple choice), the R1
protocol's figures (pass@1, cons@k, pass@k), the evaluator that samples and scores a model, and
suites of benchmarks written as one table beside published figures.

Not here: sampling itself (r1kit.sampling), running code (r1kit.execution), the eval stage's
sharding over processes (r1kit.stages.evaluate). Nothing here imports a trainer, a stage or the
pipeline; the CLI and the stages import it.
"""
