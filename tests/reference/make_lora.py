#!/usr/bin/env python3
"""make_lora.py — writes a seeded random LoRA adapter, in PEFT's layout, for a
Gemma 3 or Gemma 4 checkpoint folder.

    python3 make_lora.py MODEL_DIR OUT_DIR [--rank R] [--alpha A] [--rslora]
        [--targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]
        [--layers 0,2,5] [--seed S] [--std-a X] [--std-b Y] [--dtype f32|bf16|f16]
        [--prefix PREFIX] [--extra NAME[:SHAPE[:DTYPE]] ...]
        [--config-set KEY=JSONVALUE ...] [--config-del KEY ...]

OUT_DIR (created) receives adapter_model.safetensors and adapter_config.json, as
PEFT's save_pretrained writes them for a LoraConfig with task_type CAUSAL_LM:
for every layer of --layers (default all) and every module of --targets (default
all seven) that the layer has,
    base_model.model.<PREFIX>layers.<i>.self_attn.q_proj.lora_A.weight [r, in]
    base_model.model.<PREFIX>layers.<i>.self_attn.q_proj.lora_B.weight [out, r]
(k_proj, v_proj, o_proj under self_attn., gate_proj, up_proj, down_proj under
mlp.). The per-layer shapes come from MODEL_DIR/config.json (lora_io.TextPlan:
Gemma 4's full-layer head dim and KV heads, k_eq_v layers without v_proj,
KV-shared layers without k_proj and v_proj, double-wide MLPs); when the folder
holds safetensors they are checked against the checkpoint's own weights, and
PREFIX defaults to the one the checkpoint's layers use (else model. for a
causal-LM config, model.language_model. for a multimodal one).

Values: A ~ N(0, std_a^2) (default std_a = 1 / sqrt(in)), B ~ N(0, std_b^2)
(default 0.02; PEFT starts B at zero, which would make the adapter do nothing),
drawn in float64 from numpy's default_rng(seed), layer by layer in module order
(A then B), then stored as --dtype (f32 default; bf16 rounds the float32 value
to nearest even). --std-b 0 gives an adapter that changes nothing (B all zero,
A as with the same seed otherwise).

Options for malformed adapters (tests of the loader's refusals):
  --extra NAME[:SHAPE[:DTYPE]]  one more tensor with exactly that name; SHAPE as
      8x640 (default: the module's lora_A / lora_B shape when NAME is a decoder
      layer's projection, even one the layer lacks, else [16, r] for a name
      ending in .lora_B.weight and [r, 16] for any other); DTYPE F32
      (default), F16, BF16, F64, I32 or I64. Repeatable.
  --config-set KEY=VALUE  sets a key of adapter_config.json; VALUE is JSON
      (true, 4, "x", {"a": 1}), else taken as a string. Repeatable.
  --config-del KEY  removes a key of adapter_config.json. Repeatable.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ left beside the sources
import lora_io  # noqa: E402
from lora_io import LoraError, MODULE_PATH, MODULES, PEFT_HEAD  # noqa: E402

DTYPES = {"f32": "F32", "bf16": "BF16", "f16": "F16"}


def int_list(text):
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="make_lora.py", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("out_dir")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--rslora", action="store_true")
    p.add_argument("--targets", default=",".join(MODULES))
    p.add_argument("--layers", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std-a", type=float, default=None)
    p.add_argument("--std-b", type=float, default=0.02)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    p.add_argument("--prefix", default=None)
    p.add_argument("--extra", action="append", default=[])
    p.add_argument("--config-set", action="append", default=[])
    p.add_argument("--config-del", action="append", default=[])
    return p.parse_args(argv[1:])


def layer_prefix(entries, plan):
    """The prefix under which the checkpoint keeps its decoder layers."""
    for p in lora_io.TEXT_PREFIXES:
        if p + "layers.0.self_attn.q_proj.weight" in entries:
            return p
    if entries:
        raise LoraError("the checkpoint has no layers.0.self_attn.q_proj.weight under %s"
                        % ", ".join(lora_io.TEXT_PREFIXES))
    return "model.language_model." if plan.multimodal else "model."


def check_against_checkpoint(plan, entries, prefix):
    """Every module's shape as the plan has it, against the checkpoint's weights."""
    for i in range(plan.n_layers):
        for mod in MODULES:
            name = "%slayers.%d.%s.weight" % (prefix, i, MODULE_PATH[mod])
            d = plan.dims(i, mod)
            have = entries.get(name)
            if d is None and have is not None:
                raise LoraError("config.json says layer %d has no %s, the checkpoint holds %s %s"
                                % (i, mod, name, list(have.shape)))
            if d is not None and (have is None or have.shape != (d[1], d[0])):
                raise LoraError("config.json gives %s the shape [%d, %d], the checkpoint %s"
                                % (name, d[1], d[0],
                                   "has none" if have is None else list(have.shape)))


def extra_tensor(spec, plan, rank, rng):
    """(name, dtype, shape, bytes) of an --extra NAME[:SHAPE[:DTYPE]]."""
    parts = spec.split(":")
    name = parts[0]
    shape = None
    if len(parts) > 1 and parts[1]:
        shape = [int(d) for d in parts[1].split("x")]
    dtype = parts[2].upper() if len(parts) > 2 and parts[2] else "F32"
    if dtype not in ("F32", "F16", "BF16", "F64", "I32", "I64"):
        raise LoraError("--extra %s: dtype %s is not F32, F16, BF16, F64, I32 or I64" % (spec,
                                                                                       dtype))
    if shape is None:
        shape = [16, rank] if name.endswith(".lora_B.weight") else [rank, 16]
        if name.startswith(PEFT_HEAD):
            rest = name[len(PEFT_HEAD):]
            for part in ("A", "B"):
                tail = ".lora_%s.weight" % part
                tm = lora_io.text_module(rest[:-len(tail)]) if rest.endswith(tail) else None
                if tm and tm[1] < plan.n_layers:
                    d = plan.formula_dims(tm[1], tm[2])
                    shape = [rank, d[0]] if part == "A" else [d[1], rank]
    values = rng.standard_normal(shape) * (0.02 if dtype.startswith(("F", "B")) else 100)
    return name, dtype, shape, lora_io.from_float64(values, dtype)


def config_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv):
    a = parse_args(argv)
    try:
        cfg = lora_io.load_config(a.model_dir)
        plan = lora_io.TextPlan(cfg)
        entries = lora_io.checkpoint_entries(a.model_dir)
        auto_prefix = layer_prefix(entries, plan)
        if entries:
            check_against_checkpoint(plan, entries, auto_prefix)
        prefix = auto_prefix if a.prefix is None else a.prefix
        if a.rank < 1:
            raise LoraError("--rank must be at least 1")
        targets = [t for t in a.targets.split(",") if t]
        for t in targets:
            if t not in MODULES:
                raise LoraError("--targets: %r is not one of %s" % (t, ",".join(MODULES)))
        layers = list(range(plan.n_layers)) if a.layers is None else int_list(a.layers)
        for i in layers:
            if not 0 <= i < plan.n_layers:
                raise LoraError("--layers: %d is not a layer (the model has %d)"
                                % (i, plan.n_layers))
        dtype = DTYPES[a.dtype]

        rng = np.random.default_rng(a.seed)
        items, skipped = [], []
        for i in sorted(set(layers)):
            for mod in MODULES:
                if mod not in targets:
                    continue
                d = plan.dims(i, mod)
                if d is None:
                    skipped.append("%d.%s" % (i, mod))
                    continue
                n_in, n_out = d
                std_a = a.std_a if a.std_a is not None else 1.0 / np.sqrt(n_in)
                A = rng.standard_normal((a.rank, n_in))
                B = rng.standard_normal((n_out, a.rank))
                A = A * std_a if std_a else np.zeros_like(A)
                B = B * a.std_b if a.std_b else np.zeros_like(B)
                base = "%s%slayers.%d.%s" % (PEFT_HEAD, prefix, i, MODULE_PATH[mod])
                for part, m in (("A", A), ("B", B)):
                    raw = lora_io.from_float64(m, dtype)
                    items.append((base + ".lora_%s.weight" % part, dtype, m.shape, len(raw), raw))
        n_mod = len(items) // 2
        for spec in a.extra:
            name, dt, shape, raw = extra_tensor(spec, plan, a.rank, rng)
            if any(it[0] == name for it in items):
                raise LoraError("--extra %s: the adapter already holds that tensor" % name)
            items.append((name, dt, shape, len(raw), raw))
        if not items:
            raise LoraError("no module to adapt (layers %s, targets %s)" % (layers, targets))
        items.sort(key=lambda it: it[0])
    except LoraError as e:
        sys.stderr.write("make_lora: %s\n" % e)
        return 2

    alpha = int(a.alpha) if a.alpha == int(a.alpha) else a.alpha
    acfg = {
        "alpha_pattern": {}, "auto_mapping": None,
        "base_model_name_or_path": os.path.normpath(a.model_dir), "bias": "none",
        "corda_config": None, "eva_config": None, "exclude_modules": None,
        "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
        "layer_replication": None, "layers_pattern": None,
        "layers_to_transform": None if a.layers is None else sorted(set(layers)),
        "loftq_config": {}, "lora_alpha": alpha, "lora_bias": False, "lora_dropout": 0.0,
        "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
        "peft_type": "LORA", "r": a.rank, "rank_pattern": {}, "revision": None,
        "target_modules": [t for t in MODULES if t in targets], "task_type": "CAUSAL_LM",
        "trainable_token_indices": None, "use_dora": False, "use_rslora": bool(a.rslora),
    }
    for kv in a.config_set:
        if "=" not in kv:
            sys.stderr.write("make_lora: --config-set %r is not KEY=VALUE\n" % kv)
            return 2
        k, v = kv.split("=", 1)
        acfg[k] = config_value(v)
    for k in a.config_del:
        acfg.pop(k, None)

    os.makedirs(a.out_dir, exist_ok=True)
    lora_io.write_safetensors(os.path.join(a.out_dir, lora_io.ADAPTER_WEIGHTS), items,
                              {"format": "pt"})
    with open(os.path.join(a.out_dir, lora_io.ADAPTER_CONFIG), "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)
        f.write("\n")
    print("make_lora: %d modules (r %d, alpha %s%s, %s, prefix %s)%s%s -> %s"
          % (n_mod, a.rank, alpha, ", rslora" if a.rslora else "", dtype, prefix,
             "; skipped (absent): " + " ".join(skipped) if skipped else "",
             "; extra: " + " ".join(s.split(":")[0] for s in a.extra) if a.extra else "",
             a.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
