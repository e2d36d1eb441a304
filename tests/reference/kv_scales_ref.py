#!/usr/bin/env python3
"""An fp8 KV cache's scales in a checkpoint, written with numpy.

    kv_scales_ref.py SRC SCALED_DIR MOVED_DIR k|v [tensor|scalar|head|missing|negative|shape]

Reads SRC/model.safetensors (a checkpoint with one file) and writes
  SCALED_DIR: SRC's tensors, and for every layer that stores K/V (the layers
              with a self_attn.k_proj) self_attn.k_scale and self_attn.v_scale
              (float32): 8 for the one named (k or v), 1 for the other; its
              config.json has a compressed-tensors quantization_config with a
              kv_cache_scheme (8-bit float, static, symmetric) and no config
              groups: the KV cache's scales alone.
  MOVED_DIR:  SRC with that scale moved into the weights instead, no
              quantization_config:
                v: v_proj / 8 and o_proj * 8 (the V the cache holds is divided
                   by 8, and o_proj undoes it on the attention's output);
                k: k_norm / 8 and q_norm * 8 (norms that multiply by their
                   weight, Gemma 4's: the K the cache holds is divided by 8,
                   and every layer's queries, those reading another layer's
                   cache too, are multiplied by 8).
An fp8 cache stores e4m3(x / scale) and reads it back times the scale; with
scale 8 SCALED_DIR's cache holds exactly the codes MOVED_DIR's holds with scale
1, and every product that follows is a power of two times the same one, exact
in float32: the two give the same logits bit for bit.

Variants: tensor (scales of shape [1], the default), scalar (shape []), head
(one per kv head, strategy attn_head); broken ones for the loader's refusals:
missing (the first k_scale left out), negative (the first k_scale -8), shape
(the first k_scale of shape [2, 2]).
"""
import os
import sys

import numpy as np

from fp8_ref import read_st, write_pair

SCALE = np.float32(8.0)


def to_dtype(values, dtype):
    """float32 values (exactly representable) -> the raw bytes of dtype."""
    v = values.astype(np.float32)
    if dtype == "BF16":
        return (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    if dtype == "F16":
        return v.astype(np.float16).tobytes()
    return v.tobytes()


def main():
    src, scaled_dir, moved_dir, which = sys.argv[1:5]
    variant = sys.argv[5] if len(sys.argv) > 5 else "tensor"
    tensors = read_st(os.path.join(src, "model.safetensors"))
    scaled = {n: (d, a.shape, raw) for n, (d, a, raw) in tensors.items()}
    moved = dict(scaled)
    storing = sorted(n[: -len("k_proj.weight")] for n in tensors
                     if n.endswith("self_attn.k_proj.weight"))
    if not storing:
        sys.exit("no self_attn.k_proj.weight in " + src)
    for attn in storing:
        heads = tensors[attn + "k_proj.weight"][1].shape[0] // tensors[attn + "k_norm.weight"][1].shape[0]
        shape = {"scalar": (), "head": (heads,)}.get(variant, (1,))
        for kv in ("k", "v"):
            s = np.full(shape, SCALE if kv == which else np.float32(1.0), dtype=np.float32)
            scaled[attn + kv + "_scale"] = ("F32", shape, s.tobytes())
    first = storing[0] + "k_scale"
    if variant == "missing":
        del scaled[first]
    elif variant == "negative":
        scaled[first] = ("F32", scaled[first][1], (-np.abs(np.frombuffer(
            scaled[first][2], dtype=np.float32))).tobytes())
    elif variant == "shape":
        scaled[first] = ("F32", (2, 2), np.full((2, 2), SCALE, dtype=np.float32).tobytes())
    # the scale moved into the weights
    moves = {"v": (("self_attn.v_proj.weight", 1 / SCALE), ("self_attn.o_proj.weight", SCALE)),
             "k": (("self_attn.k_norm.weight", 1 / SCALE), ("self_attn.q_norm.weight", SCALE))}
    n_moved = 0
    for name, (dtype, arr, raw) in tensors.items():
        for suffix, factor in moves[which]:
            if name.endswith(suffix):
                moved[name] = (dtype, arr.shape, to_dtype(arr.astype(np.float32) * factor, dtype))
                n_moved += 1
    if not n_moved:
        sys.exit("nothing to move the scale into in " + src)
    write_pair(src, scaled_dir, scaled, moved_dir, moved, {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "quantization_status": "compressed",
        "config_groups": {},
        "kv_cache_scheme": {"num_bits": 8, "type": "float",
                            "strategy": "attn_head" if variant == "head" else "tensor",
                            "dynamic": False, "symmetric": True},
    })
    print(len(storing))


if __name__ == "__main__":
    main()
