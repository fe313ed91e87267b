"""Running model-written code: the local sandbox (a forked process with limits, and its fork
server), judging a program against a problem's tests, and the tools a rollout may call.

Not here: a security boundary against a determined attacker (see r1kit.execution.sandbox), the
turn loop of tool rollouts (r1kit.sampling.tool_loop). Imports nothing of training, sampling or the
stages; rewards, evaluation, sampling and the stages import it.
"""
