#!/usr/bin/env python3
"""gemma3_mm_ref.py — an independent numpy reference for Gemma 3 with images.

The logits of Gemma3ForConditionalGeneration at every position of a prompt
that holds image soft tokens, in float64. Written from Hugging Face
transformers (modeling_gemma3.py and masking_utils.py of the 5.0 development
line, read at commits 0018aa64 and 00c4411c of huggingface/transformers;
configuration_gemma3.py of 4.50 for the older config keys). It shares no code
with lmserve's C path: config.json is read with json, the safetensors files by
hand (siglip_ref.py's reader, in this folder), and the image embeddings come
from siglip_ref.encode, the numpy reference of the tower and projector.

    python3 gemma3_mm_ref.py MODEL_DIR IDS PIXELS N_IMAGES OUT [--causal] [--lora ADAPTER_DIR]

IDS: raw little-endian int32 token ids [T]. PIXELS: raw little-endian f32
[N_IMAGES, num_channels, image_size, image_size], preprocessed (as
siglip_ref.py takes them; not read when N_IMAGES is 0). OUT receives raw
little-endian f32 logits [T, vocab_size], one row per position.
--causal leaves out the images' bidirectional mask (every layer causal, and
windowed on sliding layers), for showing what the mask changes.
--lora ADAPTER_DIR runs the model with a PEFT LoRA adapter on its language
model (adapter_config.json and adapter_model.safetensors, read by lora_io.py in
this folder): each q/k/v/o and gate/up/down projection of a layer the adapter
covers adds scale * (x @ A.T) @ B.T to its output, as peft's
LoraLayer.forward (tuners/lora/layer.py, Linear.forward) does with dropout off,
scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora. The adapter's
tensors may name the layers under any of the language model's prefixes
(model., model.language_model., language_model.model., language_model.); an
adapter on anything else (the vision tower, the embeddings) is refused.

What each piece follows:
  - Gemma3Model.forward: the token embeddings, then masked_scatter of the
    image features over the positions get_placeholder_mask finds (token id
    == image_token_index), in order: the k-th image token takes row k of
    get_image_features' [n_images * mm_tokens_per_image, hidden] output. The
    rows are NOT multiplied by the embedding scale (they replace scaled
    embeddings). An image id outside the text vocabulary is looked up as 0
    first, as forward does; its row is replaced anyway. The number of image
    tokens must equal n_images * mm_tokens_per_image (get_placeholder_mask
    raises otherwise; so do we).
  - Gemma3TextScaledWordEmbedding: embed_tokens[id] * embed_scale, where
    embed_scale = torch.tensor(hidden_size ** 0.5) (float32) cast to the
    weight dtype. We round the scale to float32 and then to the dtype the
    embedding is stored in (bf16: sqrt(640) -> 25.25), i.e. the model loaded
    in its checkpoint dtype (transformers 5's default); everything after
    that runs in float64, not in the checkpoint dtype.
  - create_causal_mask_mapping + token_type_ids_mask_function: token_type_ids
    are 1 at image tokens; image_group_ids number the runs of consecutive
    image tokens (cumsum of run starts), -1 elsewhere; the extra mask is
    "query and key are image tokens of the same run". masking_utils'
    create_causal_mask / create_sliding_window_causal_mask join it with
    or_masks: full layers see (kv <= q) OR same_image; sliding layers see
    (kv <= q AND kv > q - sliding_window) OR same_image, so an image token
    sees its whole image whatever the window.
  - Gemma3TextModel.forward / Gemma3DecoderLayer.forward: per layer
    x += post_attention_layernorm(attn(input_layernorm(x)));
    x += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)));
    then the final norm.
  - Gemma3RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w).
  - Gemma3Attention: q/k/v projections without bias, q_norm / k_norm per
    head (Gemma3RMSNorm over head_dim), rotate-half RoPE (apply_rotary_pos_emb)
    with positions 0..T-1, scaling query_pre_attn_scalar ** -0.5, GQA as
    repeat_kv (query head h reads kv head h // (heads / kv_heads)),
    eager_attention_forward's softmax. attn_logit_softcapping is stored by
    the module but not passed to the attention function, so it is not
    applied (neither here).
  - Gemma3RotaryEmbedding: inv_freq = 1 / theta ** (arange(0, d, 2) / d) per
    layer type. With layer_types / rope_parameters (newer configs) each type
    has its own theta and rope type; older configs give sliding layers
    rope_local_base_freq and full layers rope_theta with rope_scaling. Rope
    type "linear" divides inv_freq by factor
    (_compute_linear_scaling_rope_parameters); other types are refused.
    transformers computes cos/sin in float32; we do it in float64.
  - Layer kinds: layer_types when present, else layer i is full iff
    (i + 1) % sliding_window_pattern == 0.
  - Gemma3MLP: down(gelu_pytorch_tanh(gate(x)) * up(x)).
  - Gemma3ForConditionalGeneration.forward: logits = lm_head(h) with lm_head
    tied to embed_tokens (tie_word_embeddings), and no final softcapping
    (the conditional-generation head does not apply it; Gemma3ForCausalLM
    does: a text-only checkpoint gets tanh(z / c) * c when
    final_logit_softcapping is set).
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import siglip_ref  # noqa: E402  (the safetensors reader and the image encoder)


# ---- checkpoint --------------------------------------------------------------------

def stored_dtypes(model_dir):
    """{tensor name: safetensors dtype string}, from the headers only."""
    out = {}
    for name in siglip_ref.checkpoint_files(model_dir):
        with open(os.path.join(model_dir, name), "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen).decode("utf-8"))
        for k, meta in header.items():
            if k != "__metadata__":
                out[k] = meta["dtype"]
    return out


def round_to_dtype(x, dtype):
    """A Python float rounded to float32, then to the stored dtype (round to nearest even)."""
    f = np.float32(x)
    if dtype == "BF16":
        u = int(np.array(f).view(np.uint32))
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return float(np.array(u, dtype=np.uint32).view(np.float32))
    if dtype == "F16":
        return float(np.float16(f))
    return float(f)


# ---- config ------------------------------------------------------------------------

class TextConfig:
    """The Gemma 3 text settings, with Gemma3TextConfig's defaults."""

    def __init__(self, cfg):
        self.multimodal = "text_config" in cfg
        tc = cfg["text_config"] if self.multimodal else cfg
        self.vocab = tc.get("vocab_size", 262208)
        self.hidden = tc.get("hidden_size", 2304)
        self.n_layers = tc.get("num_hidden_layers", 26)
        self.n_heads = tc.get("num_attention_heads", 8)
        self.n_kv = tc.get("num_key_value_heads", 4)
        self.head_dim = tc.get("head_dim", 256)
        self.eps = tc.get("rms_norm_eps", 1e-6)
        self.qpas = tc.get("query_pre_attn_scalar", 256)
        self.window = tc.get("sliding_window", 4096)
        self.final_softcap = tc.get("final_logit_softcapping")
        act = tc.get("hidden_activation", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise NotImplementedError("hidden_activation %r" % act)
        if tc.get("use_bidirectional_attention"):
            raise NotImplementedError("use_bidirectional_attention")
        self.tie = cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings", True))

        types = tc.get("layer_types")
        if types is None:
            pattern = tc.get("sliding_window_pattern", 6)
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(self.n_layers)]
        self.layer_types = types[:self.n_layers]

        # per layer type: (theta, linear factor)
        rp = tc.get("rope_parameters")
        if isinstance(rp, dict) and "full_attention" in rp:
            self.rope = {k: self.rope_entry(v) for k, v in rp.items() if v is not None}
        else:
            full = dict(rp) if isinstance(rp, dict) else dict(tc.get("rope_scaling") or {})
            full.setdefault("rope_theta", tc.get("rope_theta", 1e6))
            self.rope = {
                "sliding_attention": (tc.get("rope_local_base_freq", 1e4), 1.0),
                "full_attention": self.rope_entry(full),
            }

        self.image_id = cfg.get("image_token_index", cfg.get("image_token_id", 262144))
        self.mm_tokens = cfg.get("mm_tokens_per_image", 256)

    @staticmethod
    def rope_entry(p):
        kind = p.get("rope_type", p.get("type", "default"))
        theta = p.get("rope_theta", 1e6)
        if kind == "default":
            return (theta, 1.0)
        if kind == "linear":
            return (theta, float(p["factor"]))
        raise NotImplementedError("rope type %r" % kind)


# ---- the model ---------------------------------------------------------------------

def rms_norm(x, w, eps):
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * (1.0 + w)


def rope_tables(theta, factor, head_dim, T):
    """cos, sin [T, head_dim] for positions 0..T-1 (frequencies repeated over both halves)."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim) / factor
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang), np.sin(ang)


def rotate(x, cos, sin):
    """x [heads, T, D]: x * cos + rotate_half(x) * sin, rotate_half = (-x2, x1)."""
    h = x.shape[-1] // 2
    turned = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + turned * sin


def attention_masks(c, ids, bidir):
    """{layer type: bool [T, T] (query, key) visible}."""
    T = len(ids)
    q = np.arange(T)[:, None]
    k = np.arange(T)[None, :]
    causal = k <= q
    masks = {"full_attention": causal, "sliding_attention": causal & (k > q - c.window)}
    if bidir:
        is_image = ids == c.image_id
        starts = is_image & ~np.concatenate([[False], is_image[:-1]])
        group = np.where(is_image, np.cumsum(starts) - 1, -1)
        same = (group[:, None] == group[None, :]) & is_image[:, None] & is_image[None, :]
        masks = {kind: m | same for kind, m in masks.items()}
    return masks


def forward(c, t, prefix, embed_scale, ids, image_rows, bidir, lora=None, lora_scale=1.0):
    """lora: {(layer, module name): (A [r, in], B [out, r])}, or None."""
    T, H, nh, nkv, hd = len(ids), c.hidden, c.n_heads, c.n_kv, c.head_dim
    lora = lora or {}

    def proj(x, layer, path):
        # nn.Linear x @ W^T, plus LoraLayer's lora_B(lora_A(x)) * scaling where adapted
        y = x @ t[prefix + "layers.%d.%s.weight" % (layer, path)].T
        ab = lora.get((layer, path.split(".")[1]))
        if ab is not None:
            y = y + ((x @ ab[0].T) @ ab[1].T) * lora_scale
        return y

    E = t[prefix + "embed_tokens.weight"]
    is_image = ids == c.image_id
    lookup = np.where(is_image, 0, ids) if c.image_id >= c.vocab else ids
    x = E[lookup] * embed_scale
    n_img = int(is_image.sum())
    n_rows = 0 if image_rows is None else image_rows.shape[0]
    if n_img != n_rows:
        raise ValueError("image features and image tokens do not match: tokens %d, features %d"
                         % (n_img, n_rows))
    if n_img:
        x[is_image] = image_rows

    masks = attention_masks(c, ids, bidir)
    tables = {kind: rope_tables(theta, factor, hd, T) for kind, (theta, factor) in c.rope.items()}
    rep = nh // nkv
    scale = c.qpas ** -0.5
    for i in range(c.n_layers):
        lp = prefix + "layers.%d." % i
        kind = c.layer_types[i]
        cos, sin = tables[kind]
        h = rms_norm(x, t[lp + "input_layernorm.weight"], c.eps)
        q = proj(h, i, "self_attn.q_proj").reshape(T, nh, hd).transpose(1, 0, 2)
        k = proj(h, i, "self_attn.k_proj").reshape(T, nkv, hd).transpose(1, 0, 2)
        v = proj(h, i, "self_attn.v_proj").reshape(T, nkv, hd).transpose(1, 0, 2)
        q = rotate(rms_norm(q, t[lp + "self_attn.q_norm.weight"], c.eps), cos, sin)
        k = rotate(rms_norm(k, t[lp + "self_attn.k_norm.weight"], c.eps), cos, sin)
        k = np.repeat(k, rep, axis=0)
        v = np.repeat(v, rep, axis=0)
        s = (q @ k.transpose(0, 2, 1)) * scale
        s = np.where(masks[kind][None, :, :], s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        a = np.exp(s)
        a = a / a.sum(axis=-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        o = proj(o, i, "self_attn.o_proj")
        x = x + rms_norm(o, t[lp + "post_attention_layernorm.weight"], c.eps)
        h = rms_norm(x, t[lp + "pre_feedforward_layernorm.weight"], c.eps)
        g = siglip_ref.gelu_pytorch_tanh(proj(h, i, "mlp.gate_proj"))
        m = proj(g * proj(h, i, "mlp.up_proj"), i, "mlp.down_proj")
        x = x + rms_norm(m, t[lp + "post_feedforward_layernorm.weight"], c.eps)
    x = rms_norm(x, t[prefix + "norm.weight"], c.eps)
    head = E if c.tie or "lm_head.weight" not in t else t["lm_head.weight"]
    logits = x @ head.T
    if not c.multimodal and c.final_softcap:
        logits = np.tanh(logits / c.final_softcap) * c.final_softcap
    return logits


def text_prefix(t):
    for p in ("model.language_model.", "language_model.model.", "model."):
        if p + "embed_tokens.weight" in t:
            return p
    raise KeyError("no embed_tokens.weight under model.language_model., language_model.model. "
                   "or model.")


def read_lora(adapter_dir, c, t, prefix):
    """The adapter's {(layer, module): (A, B)} and scale, each shape checked against the
    checkpoint's weight."""
    sys.dont_write_bytecode = True  # no __pycache__ left beside the sources
    import lora_io  # only with --lora
    adapter = lora_io.Adapter(adapter_dir)
    mods = adapter.text_layers()
    for (i, mod), (a, b) in sorted(mods.items()):
        name = prefix + "layers.%d.%s.weight" % (i, lora_io.MODULE_PATH[mod])
        if i >= c.n_layers or name not in t:
            raise ValueError("%s: the adapter's layer %d %s has no weight %s"
                             % (adapter_dir, i, mod, name))
        if t[name].shape != (b.shape[0], a.shape[1]):
            raise ValueError("%s: layer %d %s: lora_B %s x lora_A %s, weight %s"
                             % (adapter_dir, i, mod, list(b.shape), list(a.shape),
                                list(t[name].shape)))
    return mods, adapter.scale


def main(argv):
    rest, lora_dir = [], None
    i = 1
    while i < len(argv):
        if argv[i] == "--lora" and i + 1 < len(argv) and lora_dir is None:
            lora_dir = argv[i + 1]
            i += 2
            continue
        rest.append(argv[i])
        i += 1
    args = [a for a in rest if a != "--causal"]
    if len(args) != 5 or len(rest) - len(args) > 1:
        sys.stderr.write(__doc__)
        return 2
    model_dir, ids_path, pixels_path, n_images, out_path = args
    n_images = int(n_images)
    bidir = "--causal" not in rest
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    c = TextConfig(cfg)
    t = siglip_ref.read_checkpoint(model_dir)
    prefix = text_prefix(t)
    embed_scale = round_to_dtype(c.hidden ** 0.5,
                                 stored_dtypes(model_dir)[prefix + "embed_tokens.weight"])
    ids = np.fromfile(ids_path, dtype="<i4").astype(np.int64)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= max(c.vocab, c.image_id + 1):
        raise ValueError("token ids outside the vocabulary (%d)" % c.vocab)
    rows = None
    if n_images > 0:
        if not c.multimodal:
            raise ValueError("images given to a text-only checkpoint")
        vc = cfg.get("vision_config", {})
        C, S = vc.get("num_channels", 3), vc.get("image_size", 224)
        pixels = np.fromfile(pixels_path, dtype="<f4").astype(np.float64)
        rows = siglip_ref.encode(cfg, t, pixels.reshape(n_images, C, S, S))
    lora, lora_scale = ({}, 1.0) if lora_dir is None else read_lora(lora_dir, c, t, prefix)
    logits = forward(c, t, prefix, embed_scale, ids, rows, bidir, lora, lora_scale)
    logits.astype("<f4").tofile(out_path)
    print("gemma3_mm_ref: %d tokens, %d images (%s%s) -> logits %dx%d"
          % (ids.size, n_images, "bidirectional" if bidir else "causal",
             "" if lora_dir is None else ", LoRA on %d modules" % len(lora), logits.shape[0],
             logits.shape[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
