#!/usr/bin/env python3
"""merge_lora.py — a checkpoint with a PEFT LoRA adapter merged into its weights.

    python3 merge_lora.py MODEL_DIR ADAPTER_DIR OUT_DIR

OUT_DIR (created; not MODEL_DIR) receives a copy of MODEL_DIR: config.json, the
tokenizer files and every other file and folder as they are, and one
model.safetensors (a sharded checkpoint's shards and index become that one
file) holding every tensor of the checkpoint. Each adapted weight W [out, in]
becomes W + scale * B @ A, computed in float64 and stored as F32 (scale =
lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora: PEFT's merge); every
other tensor is copied byte for byte with its own dtype. Other weight files
(*.gguf, *.bin, *.pt, *.pth) are left out, since they would hold the weights
unmerged.

The adapter (lora_io.Adapter) is read on its own terms: adapter_config.json
(peft_type LORA; r, lora_alpha, use_rslora with LoraConfig's defaults 8, 8,
false) and adapter_model.safetensors, whose tensors must all be
base_model.model.<path>.lora_A.weight / .lora_B.weight pairs of rank r. <path>
+ ".weight" names the weight; where the checkpoint has no such tensor and
<path> is a decoder layer's projection under one of the language model's
prefixes (model., model.language_model., language_model.model.,
language_model.), it is looked up as the checkpoint's own prefix + layers.<i>.
<...>.weight (an adapter trained on the causal-LM class applied to the
multimodal checkpoint, or the other way round).

Anything that cannot be merged exactly so is refused with exit status 2 and a
one-line reason: DoRA, trained biases, modules_to_save, fan_in_fan_out,
rank_pattern / alpha_pattern, other PEFT types, a tensor that is not a lora_A /
lora_B weight, an A without its B, a rank other than r, a target weight that is
missing, not 2-D, not F32 / F16 / BF16, or of another shape than [B rows, A
columns], and two adapter modules on one weight.
"""
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ left beside the sources
import lora_io  # noqa: E402
from lora_io import LoraError  # noqa: E402

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
INDEX = "model.safetensors.index.json"


def text_stack_prefix(entries):
    for p in lora_io.TEXT_PREFIXES:
        if (p + "embed_tokens.weight" in entries
                or p + "layers.0.self_attn.q_proj.weight" in entries):
            return p
    return None


def plan_merge(entries, adapter):
    """{checkpoint weight name: (module path, A Entry, B Entry)}."""
    own = text_stack_prefix(entries)
    targets = {}
    for path, (a, b) in adapter.modules.items():
        name = path + ".weight"
        if name not in entries:
            tm = lora_io.text_module(path)
            if tm is None or own is None:
                raise LoraError("%s: no tensor %s in the checkpoint" % (path, name))
            name = "%slayers.%d.%s.weight" % (own, tm[1], lora_io.MODULE_PATH[tm[2]])
            if name not in entries:
                raise LoraError("%s: no tensor %s in the checkpoint"
                                % (path, " nor ".join(sorted({path + ".weight", name}))))
        if name in targets:
            raise LoraError("%s and %s both adapt %s" % (targets[name][0], path, name))
        w = entries[name]
        if w.dtype not in ("F32", "F16", "BF16"):
            raise LoraError("%s: %s is %s, not F32, F16 or BF16" % (path, name, w.dtype))
        if len(w.shape) != 2 or w.shape != (b.shape[0], a.shape[1]):
            raise LoraError("%s: %s is %s, lora_B %s x lora_A %s gives [%d, %d]"
                            % (path, name, list(w.shape), list(b.shape), list(a.shape),
                               b.shape[0], a.shape[1]))
        targets[name] = (path, a, b)
    return targets


def copy_other_files(model_dir, out_dir):
    skipped = []
    for name in sorted(os.listdir(model_dir)):
        src, dst = os.path.join(model_dir, name), os.path.join(out_dir, name)
        if name == INDEX or name.endswith(WEIGHT_SUFFIXES):
            if not name.endswith(".safetensors") and name != INDEX:
                skipped.append(name)
            continue
        if os.path.isdir(src):
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copyfile(src, dst)
    return skipped


def main(argv):
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    model_dir, adapter_dir, out_dir = argv[1:]
    try:
        if os.path.exists(out_dir) and os.path.samefile(model_dir, out_dir):
            raise LoraError("OUT_DIR is MODEL_DIR")
        entries = lora_io.checkpoint_entries(model_dir)
        if not entries:
            raise LoraError("%s: no model.safetensors nor %s" % (model_dir, INDEX))
        adapter = lora_io.Adapter(adapter_dir)
        targets = plan_merge(entries, adapter)
    except LoraError as e:
        sys.stderr.write("merge_lora: %s\n" % e)
        return 2

    def merged(name):
        def make():
            path, a, b = targets[name]
            w = entries[name].float64() + adapter.scale * (b.float64() @ a.float64())
            return lora_io.from_float64(w, "F32")
        return make

    items = []
    for name in sorted(entries):
        e = entries[name]
        if name in targets:
            n = 4 * e.shape[0] * e.shape[1]
            items.append((name, "F32", e.shape, n, merged(name)))
        else:
            items.append((name, e.dtype, e.shape, e.nbytes, e.raw))
    os.makedirs(out_dir, exist_ok=True)
    skipped = copy_other_files(model_dir, out_dir)
    lora_io.write_safetensors(os.path.join(out_dir, "model.safetensors"), items,
                              {"format": "pt"})
    print("merge_lora: %d of %d tensors merged (r %d, scale %.17g)%s -> %s"
          % (len(targets), len(entries), adapter.rank, adapter.scale,
             "; left out: " + " ".join(skipped) if skipped else "", out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
