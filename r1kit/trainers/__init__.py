"""What r1kit adds to TRL's trainers, and what the training stages share.

Every change r1kit makes to TRL's code is in two files: `r1kit.trainers.trl_overrides` (r1kit's
subclasses of TRL's ``GRPOTrainer`` and ``DistillationTrainer``, whose overrides are all there,
each checked against the installed TRL before any model loads) and `r1kit.trainers.trl_patches`
(the module-level functions of TRL and transformers replaced while training, one context manager
each). The modules beside them are what those overrides switch on: r1kit's decoding loop standing
in for TRL's generation (`rollouts`), zero-advantage skipping, scoring a group's prompt once,
DAPO's dynamic sampling, LoRA; and `training`: trainer arguments, resume and metrics logs.

Not here: losses of r1kit's own (TRL computes them), the stage logic (r1kit.stages), sampling outside
training (r1kit.sampling). The stages, the pipeline's checks and the report import this package;
sampling, evaluation and code execution never do.
"""
