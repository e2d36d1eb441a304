"""lora_io.py — LoRA adapters in PEFT's layout, and the per-layer shapes of a
Gemma 3 / Gemma 4 language model, for make_lora.py, merge_lora.py and
gemma3_mm_ref.py --lora.

It shares no code with lmserve's C path (model/md-lora.h, model/md-config.c):
config.json and adapter_config.json are read with json, the safetensors files
by hand (8-byte little-endian header length, JSON header of {name: {dtype,
shape, data_offsets}}, raw little-endian data; bf16 is the upper half of an
f32).

What it follows:
  - PEFT's LoRA (peft/tuners/lora): a LoraLayer around nn.Linear W [out, in]
    holds lora_A [r, in] and lora_B [out, r]; its forward adds
    lora_B(lora_A(dropout(x))) * scaling to the base output, scaling =
    lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora. Merging replaces W
    by W + scaling * B @ A. save_pretrained names the tensors
    base_model.model.<module path>.lora_A.weight (the adapter name left out)
    and writes adapter_config.json (LoraConfig.to_dict, sorted keys).
  - The per-layer shapes, as lmserve reads them (model/md-config.c:
    parse_text, parse_layer_types, parse_per_layer, plan_layers), which agree
    with transformers' Gemma3Attention / Gemma4TextAttention / Gemma4TextMLP:
      kind: layer_types[i] when present, else full iff (i + 1) %
        sliding_window_pattern (6) == 0, and on Gemma 4 the last layer full;
      head_dim: full layers global_head_dim (default head_dim; not a Gemma 3
        field), sliding layers head_dim (default hidden_size /
        num_attention_heads); per_layer_config may override, by layer index
        or layer type;
      k_eq_v: attention_k_eq_v on a full layer: no v_proj (V is the raw K
        projection);
      KV heads: num_global_key_value_heads on k_eq_v layers when set, else
        num_key_value_heads (default num_attention_heads); per_layer_config's
        num_key_value_heads overrides;
      KV-shared: the last num_kv_shared_layers layers (every layer of a
        gemma4_assistant that names none): q_proj and o_proj only, no k_proj
        and no v_proj (transformers creates neither module there);
      ffn: intermediate_size, doubled on KV-shared layers with
        use_double_wide_mlp when some layer stores K/V (a list of one width
        per layer is taken here too; lmserve reads one integer).
    q_proj [heads * hd, hidden], k_proj / v_proj [kv * hd, hidden], o_proj
    [hidden, heads * hd], gate_proj / up_proj [ffn, hidden], down_proj
    [hidden, ffn] (nn.Linear weights, [out, in]).
"""
import json
import math
import os
import re
import struct

import numpy as np

ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")

# PEFT's target_modules names, in lmserve's order, and their paths in a decoder layer
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULE_PATH = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
               "v_proj": "self_attn.v_proj", "o_proj": "self_attn.o_proj",
               "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj"}
# where a checkpoint keeps its language model's decoder stack, the causal-LM
# class's and the multimodal classes' layouts
TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.", "language_model.")

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_HEAD = "base_model.model."


class LoraError(Exception):
    """Something the adapter, the checkpoint or the config holds that cannot be taken."""


# ---- safetensors -------------------------------------------------------------------

class Entry:
    """One tensor of a .safetensors file: where its bytes lie."""

    def __init__(self, name, dtype, shape, path, offset, nbytes):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.path, self.offset, self.nbytes = path, offset, nbytes

    def raw(self):
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.nbytes)
        if len(data) != self.nbytes:
            raise LoraError("%s: %s: the file ends inside the tensor" % (self.path, self.name))
        return data

    def float64(self):
        return to_float64(self.dtype, self.raw(), self.shape, self.name)


def list_tensors(path):
    """{name: Entry} of one .safetensors file, from its header (checked against its size)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise LoraError("%s: shorter than a safetensors header" % path)
        (hlen,) = struct.unpack("<Q", head)
        if hlen > size - 8:
            raise LoraError("%s: header length %d runs past the file" % (path, hlen))
        try:
            header = json.loads(f.read(hlen).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise LoraError("%s: header is not JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise LoraError("%s: header is not a JSON object" % path)
    base = 8 + hlen
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = meta["dtype"], [int(d) for d in meta["shape"]]
            begin, end = (int(v) for v in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise LoraError("%s: %s: header entry without dtype, shape or data_offsets"
                            % (path, name))
        if dtype not in ITEM_SIZE:
            raise LoraError("%s: %s: dtype %s is not known" % (path, name, dtype))
        n = ITEM_SIZE[dtype]
        for d in shape:
            n *= d
        if begin < 0 or end != begin + n or base + end > size:
            raise LoraError("%s: %s: data_offsets [%d, %d) do not hold %s %s in the file"
                            % (path, name, begin, end, dtype, shape))
        out[name] = Entry(name, dtype, shape, path, base + begin, n)
    return out


def checkpoint_files(model_dir):
    """The checkpoint's .safetensors files: the index's, else model.safetensors
    (an empty list where there is neither)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    if os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return ["model.safetensors"]
    return []


def checkpoint_entries(model_dir):
    """{name: Entry} over every file of the checkpoint; a name in two files is an error."""
    out = {}
    for name in checkpoint_files(model_dir):
        for k, e in list_tensors(os.path.join(model_dir, name)).items():
            if k in out:
                raise LoraError("%s: tensor %s is in %s and %s"
                                % (model_dir, k, os.path.basename(out[k].path), name))
            out[k] = e
    return out


def to_float64(dtype, raw, shape, name="tensor"):
    if dtype == "F64":
        arr = np.frombuffer(raw, dtype="<f8")
    elif dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2")
    elif dtype == "BF16":
        arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise LoraError("%s: dtype %s is not a float type (F32, F16, BF16, F64)" % (name, dtype))
    return arr.astype(np.float64).reshape(shape)


def f32_to_bf16(x):
    """float32 values -> bf16 bit patterns (uint16), rounded to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), r).astype(np.uint16)


def from_float64(x, dtype):
    """float64 values -> the raw little-endian bytes of dtype (F64, F32, F16, BF16)."""
    if dtype == "F64":
        return np.ascontiguousarray(x, dtype="<f8").tobytes()
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(np.asarray(x, dtype=np.float32), dtype="<f2").tobytes()
    if dtype == "BF16":
        return f32_to_bf16(np.asarray(x, dtype=np.float32)).astype("<u2").tobytes()
    ints = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1"}
    if dtype in ints:
        return np.ascontiguousarray(np.rint(x), dtype=ints[dtype]).tobytes()
    raise LoraError("cannot write dtype %s" % dtype)


def write_safetensors(path, items, metadata=None):
    """items: (name, dtype, shape, nbytes, data) in file order, data the bytes or a
    function returning them (called once, in order, so that a large checkpoint is
    written one tensor at a time). The header is padded with spaces to a multiple
    of 8 bytes."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, nbytes, _ in items:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape, nbytes, data in items:
            blob = data() if callable(data) else data
            if len(blob) != nbytes:
                raise LoraError("%s: %d bytes where the header says %d" % (name, len(blob), nbytes))
            f.write(blob)
    os.replace(tmp, path)


# ---- the language model's per-layer shapes -----------------------------------------

def _int(tc, key, default, required=False):
    v = tc.get(key)
    if v is None:
        if required:
            raise LoraError("config.json: %s missing" % key)
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise LoraError("config.json: %s is not an integer" % key)
    return int(v)


class TextPlan:
    """The language model's layers: kind, head dim, KV heads, k_eq_v, KV-shared, ffn."""

    def __init__(self, cfg):
        mt = cfg.get("model_type")
        nested = {"gemma3_text": False, "gemma3": True, "gemma4_text": False, "gemma4": True,
                  "gemma4_assistant": True}
        if mt not in nested:
            raise LoraError("config.json: model_type %r is not supported (gemma3_text, gemma3, "
                            "gemma4_text, gemma4, gemma4_assistant)" % mt)
        self.model_type = mt
        self.gemma3 = mt.startswith("gemma3")
        self.multimodal = mt in ("gemma3", "gemma4")
        tc = cfg.get("text_config") if nested[mt] else cfg
        if not isinstance(tc, dict):
            raise LoraError("config.json: text_config missing for %s" % mt)
        self.hidden = _int(tc, "hidden_size", 0, True)
        self.n_layers = L = _int(tc, "num_hidden_layers", 0, True)
        self.n_heads = _int(tc, "num_attention_heads", 0, True)
        n_kv = _int(tc, "num_key_value_heads", self.n_heads)
        head_dim = _int(tc, "head_dim", self.hidden // self.n_heads)
        global_hd = _int(tc, "global_head_dim", head_dim)
        if self.gemma3:
            global_hd = head_dim  # not a Gemma 3 field
        n_global_kv = _int(tc, "num_global_key_value_heads", 0)
        n_shared = _int(tc, "num_kv_shared_layers", 0)
        if mt == "gemma4_assistant" and n_shared == 0:
            n_shared = L  # every assistant layer reads the target's cache
        k_eq_v = bool(tc.get("attention_k_eq_v", False))
        double_wide = bool(tc.get("use_double_wide_mlp", False))
        ffn = tc.get("intermediate_size")
        if isinstance(ffn, list):  # per-layer widths (lmserve reads one integer only)
            if len(ffn) != L:
                raise LoraError("config.json: intermediate_size lists %d entries, not %d"
                                % (len(ffn), L))
            ffns = [int(v) for v in ffn]
        else:
            ffns = [_int(tc, "intermediate_size", 0, True)] * L

        types = tc.get("layer_types")
        if types is not None:
            if not isinstance(types, list) or len(types) != L:
                raise LoraError("config.json: layer_types must list %d entries" % L)
            kinds = []
            for i, s in enumerate(types):
                if s not in ("sliding_attention", "full_attention"):
                    raise LoraError("config.json: layer_types[%d] %r is not supported" % (i, s))
                kinds.append("full" if s == "full_attention" else "sliding")
        else:
            pattern = _int(tc, "sliding_window_pattern", 6)
            kinds = ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(L)]
            if not self.gemma3:
                kinds[-1] = "full"

        # per_layer_config: {"<index>" or "<layer type>": {head_dim, num_key_value_heads}}
        ov_hd, ov_kv = [0] * L, [0] * L
        plc = tc.get("per_layer_config")
        if plc is not None:
            if not isinstance(plc, dict):
                raise LoraError("config.json: per_layer_config is not an object")
            for key, val in plc.items():
                if key in ("full_attention", "sliding_attention"):
                    which = [i for i in range(L) if kinds[i] == key.split("_")[0]]
                else:
                    try:
                        which = [int(key)]
                    except ValueError:
                        which = [-1]
                    if not 0 <= which[0] < L:
                        raise LoraError("config.json: per_layer_config key %r is not a layer" % key)
                hd, kv = _int(val, "head_dim", 0), _int(val, "num_key_value_heads", 0)
                for i in which:
                    if hd:
                        ov_hd[i] = hd
                    if kv:
                        ov_kv[i] = kv
                    if hd and kinds[i] == "full" and "global_head_dim" not in tc:
                        global_hd = hd

        first_shared = L - n_shared
        self.layers = []
        for i in range(L):
            full = kinds[i] == "full"
            hd = global_hd if full else head_dim
            if ov_hd[i] and ov_hd[i] != hd:
                raise LoraError("config.json: per_layer_config: layer %d head_dim %d differs from "
                                "the other %s layers' %d" % (i, ov_hd[i], kinds[i], hd))
            keqv = k_eq_v and full
            kv = n_global_kv if keqv and n_global_kv else n_kv
            if ov_kv[i]:
                kv = ov_kv[i]
            shared = i >= first_shared
            width = ffns[i] * (2 if double_wide and shared and first_shared > 0 else 1)
            self.layers.append({"kind": kinds[i], "head_dim": hd, "n_kv_heads": kv,
                                "k_eq_v": keqv, "kv_shared": shared, "ffn": width})

    def dims(self, layer, mod):
        """(in, out) of module mod ("q_proj", ...) in layer, or None where the layer has none."""
        lc = self.layers[layer]
        H, q, kv = self.hidden, self.n_heads * lc["head_dim"], lc["n_kv_heads"] * lc["head_dim"]
        if mod in ("k_proj", "v_proj") and lc["kv_shared"]:
            return None
        if mod == "v_proj" and lc["k_eq_v"]:
            return None
        return {"q_proj": (H, q), "k_proj": (H, kv), "v_proj": (H, kv), "o_proj": (q, H),
                "gate_proj": (H, lc["ffn"]), "up_proj": (H, lc["ffn"]),
                "down_proj": (lc["ffn"], H)}[mod]

    def formula_dims(self, layer, mod):
        """(in, out) as if the layer had the module (k and v on KV-shared layers, v on k_eq_v
        layers: the shapes a malformed adapter would give them)."""
        lc = self.layers[layer]
        kv = lc["n_kv_heads"] * lc["head_dim"]
        if mod in ("k_proj", "v_proj"):
            return (self.hidden, kv)
        return self.dims(layer, mod)


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


# ---- adapters ----------------------------------------------------------------------

_TEXT_MODULE = re.compile(r"^(.*?)layers\.(\d+)\.(self_attn\.(?:q|k|v|o)_proj|"
                          r"mlp\.(?:gate|up|down)_proj)$")


def text_module(path):
    """(prefix, layer, module name) where path is a decoder layer's projection under one of
    TEXT_PREFIXES ("model.layers.3.self_attn.q_proj" -> ("model.", 3, "q_proj")), else None."""
    m = _TEXT_MODULE.match(path)
    if not m or m.group(1) not in TEXT_PREFIXES:
        return None
    return m.group(1), int(m.group(2)), m.group(3).split(".")[1]


def _empty(v):
    return v is None or v == {} or v == [] or v is False


class Adapter:
    """A PEFT LoRA adapter folder: its settings and {module path: (A Entry, B Entry)}."""

    def __init__(self, adapter_dir):
        path = os.path.join(adapter_dir, ADAPTER_CONFIG)
        try:
            with open(path) as f:
                cfg = json.load(f)
        except OSError as e:
            raise LoraError("%s: %s" % (path, e.strerror))
        except ValueError as e:
            raise LoraError("%s: not JSON: %s" % (path, e))
        if not isinstance(cfg, dict):
            raise LoraError("%s: not a JSON object" % path)
        self.config = cfg
        if cfg.get("peft_type") != "LORA":
            raise LoraError("%s: peft_type %r is not LORA" % (path, cfg.get("peft_type")))
        # LoraConfig's defaults where a key is absent: r 8, lora_alpha 8, use_rslora false
        r = cfg.get("r", 8)
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise LoraError("%s: r %r is not a positive integer" % (path, r))
        alpha = cfg.get("lora_alpha", 8)
        if (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                or not math.isfinite(alpha)):
            raise LoraError("%s: lora_alpha %r is not a number" % (path, alpha))
        rslora = cfg.get("use_rslora", False)
        if not isinstance(rslora, bool):
            raise LoraError("%s: use_rslora %r is not a boolean" % (path, rslora))
        refused = [("use_dora", lambda v: v is True, "DoRA"),
                   ("bias", lambda v: v not in (None, "none"), "trained biases"),
                   ("modules_to_save", lambda v: not _empty(v), "modules saved whole"),
                   ("fan_in_fan_out", lambda v: v is True, "weights stored transposed"),
                   ("rank_pattern", lambda v: not _empty(v), "per-module ranks"),
                   ("alpha_pattern", lambda v: not _empty(v), "per-module alphas"),
                   ("lora_bias", lambda v: v is True, "LoRA biases"),
                   ("layer_replication", lambda v: not _empty(v), "layer replication"),
                   ("use_qalora", lambda v: v is True, "QALoRA"),
                   ("trainable_token_indices", lambda v: not _empty(v), "trainable tokens"),
                   ("target_parameters", lambda v: not _empty(v), "adapted parameters")]
        for key, bad, what in refused:
            if key in cfg and bad(cfg[key]):
                raise LoraError("%s: %s %s is not supported (%s)"
                                % (path, key, json.dumps(cfg[key]), what))
        self.rank, self.alpha, self.rslora = r, float(alpha), rslora
        self.scale = self.alpha / math.sqrt(r) if rslora else self.alpha / r

        wpath = os.path.join(adapter_dir, ADAPTER_WEIGHTS)
        if not os.path.exists(wpath):
            raise LoraError("%s: missing" % wpath)
        halves = {}
        for name, e in list_tensors(wpath).items():
            if not name.startswith(PEFT_HEAD):
                raise LoraError("%s: tensor %s does not start with %s" % (wpath, name, PEFT_HEAD))
            rest = name[len(PEFT_HEAD):]
            for part in ("A", "B"):
                tail = ".lora_%s.weight" % part
                if rest.endswith(tail) and len(rest) > len(tail):
                    halves.setdefault(rest[:-len(tail)], {})[part] = e
                    break
            else:
                raise LoraError("%s: tensor %s is neither a lora_A nor a lora_B weight"
                                % (wpath, name))
            if e.dtype not in FLOAT_DTYPES:
                raise LoraError("%s: tensor %s: dtype %s is not a float type" % (wpath, name,
                                                                                e.dtype))
        self.modules = {}
        for mod, h in sorted(halves.items()):
            if set(h) != {"A", "B"}:
                raise LoraError("%s: %s has lora_%s without lora_%s"
                                % (wpath, mod, "A" if "A" in h else "B", "B" if "A" in h else "A"))
            a, b = h["A"], h["B"]
            if len(a.shape) != 2 or len(b.shape) != 2:
                raise LoraError("%s: %s: lora_A %s and lora_B %s must be 2-D"
                                % (wpath, mod, list(a.shape), list(b.shape)))
            if a.shape[0] != r or b.shape[1] != r:
                raise LoraError("%s: %s: lora_A %s and lora_B %s do not have rank r = %d"
                                % (wpath, mod, list(a.shape), list(b.shape), r))
            self.modules[mod] = (a, b)
        if not self.modules:
            raise LoraError("%s: no lora_A / lora_B tensors" % wpath)
        self.weights_path = wpath

    def text_layers(self, plan=None):
        """{(layer, module name): (A, B)} as float64 arrays, every module a decoder layer's
        projection of the language model (anything else refused); with plan, each shape
        and layer is checked against the model's."""
        out = {}
        for path, (a, b) in self.modules.items():
            tm = text_module(path)
            if tm is None:
                raise LoraError("%s: %s is not a language-model layer's q/k/v/o or gate/up/down "
                                "projection" % (self.weights_path, path))
            _, layer, mod = tm
            if (layer, mod) in out:
                raise LoraError("%s: layer %d %s is adapted twice (%s)"
                                % (self.weights_path, layer, mod, path))
            if plan is not None:
                if layer >= plan.n_layers:
                    raise LoraError("%s: %s: the model has %d layers"
                                    % (self.weights_path, path, plan.n_layers))
                d = plan.dims(layer, mod)
                if d is None:
                    raise LoraError("%s: %s: layer %d has no %s"
                                    % (self.weights_path, path, layer, mod))
                if a.shape[1] != d[0] or b.shape[0] != d[1]:
                    raise LoraError("%s: %s: lora_A %s / lora_B %s where the module is [%d, %d] "
                                    "(out, in)" % (self.weights_path, path, list(a.shape),
                                                   list(b.shape), d[1], d[0]))
            out[(layer, mod)] = (a.float64(), b.float64())
        return out
