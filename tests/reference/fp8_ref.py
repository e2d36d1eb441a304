#!/usr/bin/env python3
"""FP8 (e4m3) weights, written from the format's definition with numpy.

    fp8_ref.py SRC FP8_DIR DEQ_DIR [channel|tensor|pow2|no-scale|bad-scale|scale-shape|f8-norm]

Reads SRC/model.safetensors (a checkpoint with one file) and quantizes every
linear layer's weight to OCP E4M3FN: a scale per output channel (or one per
tensor), scale = largest magnitude / 448 in float32 (1 for all zeros), codes
= round-to-nearest-even of weight / scale, saturating at +-448. Writes
  FP8_DIR: a compressed-tensors checkpoint (F8_E4M3 weights and their
           weight_scale, quantization_config in config.json);
  DEQ_DIR: the same checkpoint with each quantized weight replaced by its
           dequantized value (code value * scale, float32).
pow2 rounds each channel's scale up to a power of two, so that a dequantized
weight (code value * scale) is exact in float32. The last four write a broken FP8 checkpoint (the first weight_scale missing,
negative, of a wrong shape; a norm weight stored as F8_E4M3) for the
loader's refusals. The rounding searches the 127 non-negative finite codes' values; it shares
nothing with the C conversion it checks.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

LINEAR = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "per_layer_input_gate.weight", "per_layer_projection.weight",
          "per_layer_model_projection.weight")

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": "bf16", "F8_E4M3": np.uint8,
          "I64": np.int64, "I32": np.int32}


def e4m3_values():
    """Value of every code 0..126 (the non-negative finite ones), increasing."""
    v = np.zeros(127, dtype=np.float64)
    for c in range(127):
        e, m = c >> 3, c & 7
        v[c] = (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return v


VALS = e4m3_values()


def to_e4m3(x):
    """float32 array -> uint8 codes: nearest value, ties to the even code."""
    a = np.abs(x.astype(np.float64))
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    a = np.minimum(a, 448.0)
    hi = np.clip(np.searchsorted(VALS, a, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - VALS[lo], VALS[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (pick.astype(np.uint8) | sign).astype(np.uint8)


def from_e4m3(c):
    v = VALS[(c & 0x7F).astype(np.int64)]
    return np.where(c & 0x80, -v, v)


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        o0, o1 = info["data_offsets"]
        raw = np.frombuffer(data[o0:o1], dtype=np.uint8)
        dt = DTYPES[info["dtype"]]
        if dt == "bf16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw.view(dt)
        out[name] = (info["dtype"], arr.reshape(info["shape"]), raw)
    return out


def write_st(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        b = bytes(raw)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_pair(src, q_dir, q_tensors, plain_dir, plain_tensors, quantization_config):
    """Two checkpoints beside src, with its config, generation config and
    tokenizer: q_dir holds q_tensors and the config with quantization_config,
    plain_dir plain_tensors and the config as it is."""
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    for d, tensors in ((q_dir, q_tensors), (plain_dir, plain_tensors)):
        os.makedirs(d, exist_ok=True)
        for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(src, extra)):
                shutil.copy(os.path.join(src, extra), d)
        write_st(os.path.join(d, "model.safetensors"), tensors)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(config, quantization_config=quantization_config) if d == q_dir
                      else config, f)


def quantize(w, strategy, pow2):
    w = w.astype(np.float32)
    if strategy == "tensor":
        amax = np.full((w.shape[0], 1), np.abs(w).max(), dtype=np.float32)
    else:
        amax = np.abs(w).max(axis=1, keepdims=True).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
    if pow2:
        scale = np.exp2(np.ceil(np.log2(scale.astype(np.float64)))).astype(np.float32)
    codes = to_e4m3((w / scale).astype(np.float32))
    return codes, scale


def main():
    src, fp8_dir, deq_dir = sys.argv[1:4]
    variant = sys.argv[4] if len(sys.argv) > 4 else "channel"
    strategy = "tensor" if variant == "tensor" else "channel"
    tensors = read_st(os.path.join(src, "model.safetensors"))
    fp8, deq = {}, {}
    n_quant = 0
    for name, (dtype, arr, raw) in tensors.items():
        if not name.endswith(LINEAR):
            fp8[name] = deq[name] = (dtype, arr.shape, raw)
            continue
        n_quant += 1
        codes, scale = quantize(arr, strategy, variant == "pow2")
        fp8[name] = ("F8_E4M3", arr.shape, codes.tobytes())
        s = scale[:1].reshape(1) if strategy == "tensor" else scale
        fp8[name + "_scale"] = ("F32", s.shape, s.astype(np.float32).tobytes())
        value = (from_e4m3(codes).astype(np.float32) * scale).astype(np.float32)
        deq[name] = ("F32", arr.shape, value.tobytes())
    if not n_quant:
        sys.exit("no linear weights in " + src)
    first = next(n for n in fp8 if n.endswith("_scale"))
    if variant == "no-scale":
        del fp8[first]
    elif variant == "bad-scale":
        dtype, shape, raw = fp8[first]
        s = np.frombuffer(raw, dtype=np.float32).copy()
        s[0] = -s[0]
        fp8[first] = (dtype, shape, s.tobytes())
    elif variant == "scale-shape":
        dtype, shape, raw = fp8[first]
        fp8[first] = (dtype, (shape[0], 2), raw + raw)
    elif variant == "f8-norm":
        norm = next(n for n in fp8 if n.endswith("input_layernorm.weight"))
        dtype, shape, raw = tensors[norm][0], tensors[norm][1].shape, tensors[norm][1]
        fp8[norm] = ("F8_E4M3", shape, to_e4m3(raw.astype(np.float32)).tobytes())
    write_pair(src, fp8_dir, fp8, deq_dir, deq, {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                        "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "symmetric": True, "dynamic": True}}},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    })
    print(n_quant)


if __name__ == "__main__":
    main()
