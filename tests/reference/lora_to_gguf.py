#!/usr/bin/env python3
"""lora_to_gguf.py — a PEFT LoRA adapter (as make_lora.py writes it) as the GGUF
adapter file llama.cpp's convert_lora_to_gguf.py writes for a Gemma 3 or Gemma 4
base model, the one `llama-server --lora FILE` loads: an independent writer of
that layout for lmserve's tests (it shares no code with lmserve's C reader; the
PEFT safetensors file is read with lora_io.list_tensors).

    python3 lora_to_gguf.py PEFT_DIR OUT.gguf --arch gemma3|gemma4
        [--outtype f32|f16|bf16|q8_0]

Written from llama.cpp's convert_lora_to_gguf.py (its LoraModel on the Gemma
model classes of conversion/gemma.py and conversion/base.py's ModelBase) and
gguf-py (constants.py's key and tensor names, tensor_mapping.py's map,
gguf_writer.py's layout, quants.py's conversions):
  - names: "base_model.model." is dropped and ".lora_A.weight" / ".lora_B.weight"
    become ".weight" (get_base_tensor_name); a leading "model.language_model."
    becomes "model." and a leading "language_model." goes (LoraModel.
    modify_tensors); then tensor_mapping.py's rows for Gemma: model.layers.N.
    self_attn.q_proj / k_proj / v_proj / o_proj are blk.N.attn_q / attn_k /
    attn_v / attn_output, mlp.gate_proj / up_proj / down_proj blk.N.ffn_gate /
    ffn_up / ffn_down; each module's A is written as NAME.weight.lora_a, its B as
    NAME.weight.lora_b (A then B, modules in the order of the PEFT file's sorted
    names). Token embeddings (PEFT's embed_tokens.lora_embedding_A / _B) are
    token_embd.weight.lora_a, A transposed, and .lora_b, as the converter writes
    them for mergekit-extract-lora's adapters. Any other tensor stops the
    conversion, as the converter's does (it cannot map it).
  - shapes: the numpy shape reversed (ggml's ne, innermost first): A [r, in] is
    ne [in, r], B [out, r] is ne [r, out];
  - values: a tensor that is neither F16 nor F32 is first made F32 (BF16
    exactly so), and A and B of different dtypes both F32 (LoraTorchTensor);
    then --outtype: f32 (the converter's default), f16 (numpy's rounding to
    nearest even), bf16 (gguf-py's: to nearest even, NaN kept quiet) or q8_0
    (gguf-py's: blocks of 32 along a row, d = max|x| / 127 stored as f16,
    q = round half away from zero of x / d; a tensor whose rows are not whole
    blocks, such as a B of rank below 32, falls back to f16 as the converter
    does);
  - keys, in the converter's order: general.architecture (the --arch),
    general.type "adapter", adapter.type "lora", general.name (the PEFT folder's
    name), adapter.lora.alpha (adapter_config.json's lora_alpha as f32; the
    converter requires it), adapter.alora.invocation_tokens (u32 array, only when
    adapter_config.json lists alora_invocation_tokens), general.quantization_version
    2;
  - GGUF v3, little-endian, the data section and each tensor aligned to 32 bytes.

Refused with exit status 2 and a one-line reason: a config without lora_alpha, a
tensor the converter cannot map, an A without its B, and use_rslora. The
converter writes lora_alpha as it is whatever use_rslora says, and llama.cpp
scales by alpha / r: an rsLoRA adapter would come out scaled by sqrt(r) less
than PEFT scales it, so it is not written at all here (an invocation_string
without alora_invocation_tokens is refused too: tokenizing it needs the base
model's tokenizer).
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ left beside the sources
import lora_io  # noqa: E402
from lora_io import LoraError  # noqa: E402

ALIGN = 32
# ggml types (ggml.h) and GGUF value types (gguf.h)
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
GGUF_U32, GGUF_F32, GGUF_STRING, GGUF_ARRAY = 4, 6, 8, 9

# tensor_mapping.py's rows for a decoder layer's projections (Gemma 3 and Gemma 4)
LAYER_MAP = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")


def base_name(name):
    """get_base_tensor_name, then LoraModel.modify_tensors' prefix rewrite."""
    s = name.replace("base_model.model.", "")
    for tail in (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B"):
        s = s.replace(tail, ".weight")
    for prefix, repl in (("model.language_model.", "model."), ("language_model.", "")):
        if s.startswith(prefix):
            s = repl + s[len(prefix):]
            break
    return s


def gguf_name(base):
    """tensor_mapping.py's name of a converted base name, or None."""
    if base == "model.embed_tokens.weight":
        return "token_embd.weight"
    m = _LAYER.match(base)
    if m and m.group(2) in LAYER_MAP:
        return "blk.%s.%s.weight" % (m.group(1), LAYER_MAP[m.group(2)])
    return None


def load_array(e):
    """A PEFT tensor as numpy: F16 and F32 as they are, anything else as F32."""
    raw = e.raw()
    if e.dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(e.shape)
    if e.dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").reshape(e.shape)
    if e.dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(e.shape)
    return lora_io.to_float64(e.dtype, raw, e.shape, e.name).astype(np.float32)


def to_bf16(x):
    """gguf-py's bf16: to nearest even, NaN made quiet (bits 0x0040 set)."""
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, (n & 0xFFFF0000) | (64 << 16), n)
    return ((n + (0x7FFF + ((n >> 16) & 1))) >> 16).astype("<u2")


def roundf(x):
    """Round half away from zero (C's roundf) as gguf-py's np_roundf does it: the floor of
    |x| plus the floor of twice its fraction (no x + 0.5, which rounds below 0.5 up)."""
    a = np.abs(x)
    f = np.floor(a)
    return np.sign(x) * (f + np.floor(2 * (a - f)))


def to_q8_0(x):
    """gguf-py's Q8_0 blocks (f16 d, 32 int8) of x [rows, cols], cols a multiple of 32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    qs = roundf(blocks * inv).astype(np.int8)
    out = np.concatenate([d.astype("<f2").view(np.uint8), qs.view(np.uint8)], axis=1)
    return out.tobytes()


def encode(x, outtype):
    """(ggml type, bytes) of a 2-D array as --outtype stores it."""
    if outtype == "q8_0":
        if x.shape[-1] % 32 == 0:
            return GGML_Q8_0, to_q8_0(x.astype(np.float32))
        outtype = "f16"  # gguf-py's QuantError: the converter falls back to F16
    if outtype == "f32":
        return GGML_F32, np.ascontiguousarray(x, dtype="<f4").tobytes()
    if outtype == "f16":
        return GGML_F16, np.ascontiguousarray(x, dtype="<f2").tobytes()
    return GGML_BF16, to_bf16(x).tobytes()


class Writer:
    """A GGUF v3 file: metadata pairs, then 2-D tensors."""

    def __init__(self):
        self.kv, self.tensors = [], []

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def string(self, key, v):
        self.kv.append(self._str(key) + struct.pack("<I", GGUF_STRING) + self._str(v))

    def f32(self, key, v):
        self.kv.append(self._str(key) + struct.pack("<If", GGUF_F32, v))

    def u32(self, key, v):
        self.kv.append(self._str(key) + struct.pack("<II", GGUF_U32, v))

    def u32s(self, key, vs):
        self.kv.append(self._str(key) + struct.pack("<IIQ", GGUF_ARRAY, GGUF_U32, len(vs)) +
                       b"".join(struct.pack("<I", v) for v in vs))

    def tensor(self, name, ne, typ, data):
        self.tensors.append((name, ne, typ, data))

    def write(self, path):
        head = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))] + self.kv
        off = 0
        for name, ne, typ, data in self.tensors:
            head.append(self._str(name) + struct.pack("<I", len(ne)) +
                        b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", typ, off))
            off += len(data) + (-len(data) % ALIGN)
        blob = b"".join(head)
        blob += b"\0" * (-len(blob) % ALIGN)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
            for _, _, _, data in self.tensors:
                f.write(data)
                f.write(b"\0" * (-len(data) % ALIGN))
        os.replace(tmp, path)


def convert(peft_dir, arch, outtype):
    """The Writer of the adapter in peft_dir."""
    cpath = os.path.join(peft_dir, lora_io.ADAPTER_CONFIG)
    try:
        with open(cpath) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise LoraError("%s: %s" % (cpath, e))
    if not isinstance(cfg, dict):
        raise LoraError("%s: not a JSON object" % cpath)
    alpha = cfg.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise LoraError("%s: lora_alpha %r is not a number (the converter requires it)"
                        % (cpath, alpha))
    if cfg.get("use_rslora") is True:
        raise LoraError("%s: use_rslora is set: llama.cpp scales a GGUF adapter by alpha / r, "
                        "PEFT this one by alpha / sqrt(r)" % cpath)
    tokens = cfg.get("alora_invocation_tokens")
    if cfg.get("invocation_string") and not tokens:
        raise LoraError("%s: invocation_string needs the base model's tokenizer" % cpath)

    wpath = os.path.join(peft_dir, lora_io.ADAPTER_WEIGHTS)
    entries = lora_io.list_tensors(wpath)
    pairs = {}  # base name -> {"A": Entry, "B": Entry}, in the sorted names' order
    for name in sorted(entries):
        is_a = ".lora_A.weight" in name or ".lora_embedding_A" in name
        is_b = ".lora_B.weight" in name or ".lora_embedding_B" in name
        if not is_a and not is_b:
            raise LoraError("%s: tensor %s is not a lora_A or lora_B tensor" % (wpath, name))
        pairs.setdefault(base_name(name), {})["A" if is_a else "B"] = entries[name]

    w = Writer()
    w.string("general.architecture", arch)
    w.string("general.type", "adapter")
    w.string("adapter.type", "lora")
    w.string("general.name", os.path.basename(os.path.normpath(peft_dir)))
    w.f32("adapter.lora.alpha", float(alpha))
    if tokens:
        w.u32s("adapter.alora.invocation_tokens", [int(t) for t in tokens])
    w.u32("general.quantization_version", 2)

    for base, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise LoraError("%s: %s has no lora_%s" % (wpath, base, "B" if "A" in ab else "A"))
        g = gguf_name(base)
        if g is None:
            raise LoraError("%s: cannot map tensor %s (%s)" % (wpath, base,
                                                              ab["A"].name))
        a, b = load_array(ab["A"]), load_array(ab["B"])
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise LoraError("%s: %s: lora_A %s and lora_B %s do not pair"
                            % (wpath, base, list(a.shape), list(b.shape)))
        if a.dtype != b.dtype:
            a, b = a.astype(np.float32), b.astype(np.float32)
        if g == "token_embd.weight":
            a = a.T
        for suffix, x in ((".lora_a", a), (".lora_b", b)):
            typ, data = encode(x, outtype)
            w.tensor(g + suffix, list(reversed(x.shape)), typ, data)
    return w


def main(argv):
    p = argparse.ArgumentParser(prog="lora_to_gguf.py", description=__doc__.split("\n\n")[0])
    p.add_argument("peft_dir")
    p.add_argument("out")
    p.add_argument("--arch", choices=("gemma3", "gemma4"), required=True)
    p.add_argument("--outtype", choices=("f32", "f16", "bf16", "q8_0"), default="f32")
    a = p.parse_args(argv[1:])
    try:
        w = convert(a.peft_dir, a.arch, a.outtype)
    except LoraError as e:
        sys.stderr.write("lora_to_gguf: %s\n" % e)
        return 2
    w.write(a.out)
    print("lora_to_gguf: %d tensors (%s, %s) -> %s" % (len(w.tensors), a.arch, a.outtype, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
