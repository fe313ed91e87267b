"""The offline demo world: a tiny model and tokenizer built without the hub (r1kit.offline.tiny),
the synthetic reasoning tasks the demos train and evaluate on (r1kit.offline.tasks), and the
pretraining corpus of R1-Zero's tiny base model (r1kit.offline.corpus).

Not here: anything a real recipe on a real model needs; nothing here imports a trainer, a stage or
sampling. Data loading, benchmarks and the model reference import it.
"""
