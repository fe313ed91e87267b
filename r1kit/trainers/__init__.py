"""What r1kit adds to TRL's trainers, and what the training stages share.

Every change r1kit makes to TRL's code is in `r1kit.trainers.trl_grpo` (one `GRPOTrainer` subclass
whose overrides are all in one file, each checked against the installed TRL before compute) and
`r1kit.trainers.trl_patches` (TRL's module-level functions r1kit replaces, one function each). The
modules beside them are the features those overrides switch on: zero-advantage skipping, scoring a
group's prompt once, DAPO's dynamic sampling, LoRA; and `training`: trainer arguments, resume and
metrics logs.

Not here: losses of r1kit's own (TRL computes them), the stage logic (r1kit.stages), sampling outside
training (r1kit.sampling). Only the stages, the pipeline's checks and the report import this package.
"""
