"""GGUF model files as a recipe's model source (``model: path/to/model.gguf``).

transformers reads a GGUF file (with the `gguf` package) and dequantizes it, but a model loaded
that way refuses `save_pretrained`, and trainers save checkpoints. `convert_gguf` therefore
rebuilds the model from its plain config (without the quantization entry), copies the
dequantized weights in, and saves model and tokenizer as an ordinary Hugging Face folder once per
run. Weights stay at the GGUF file's precision after dequantization (e.g. Q4_1 → float32).

Not here: quantized training; the converted folder is a full-precision model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def convert_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Write a plain Hugging Face model folder for `gguf_file` into `out_dir`; returns it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    plain_config = type(config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(plain_config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, out_dir)
    return out_dir
