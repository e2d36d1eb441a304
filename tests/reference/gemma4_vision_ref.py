#!/usr/bin/env python3
"""gemma4_vision_ref.py — an independent numpy reference for Gemma 4's image
encoder: the vision tower, its pooling and the embedder into the text width.

Written from Hugging Face transformers' models/gemma4/modeling_gemma4.py, in
float64, following these of its pieces:
  - Gemma4VisionModel.forward: padding patches are those at (-1, -1); the
    output length is max_patches / pooling_kernel_size^2; padding rows are
    stripped after pooling (pooler_mask); standardisation
    (h - std_bias) * std_scale when config.standardize;
  - Gemma4VisionPatchEmbedder: 2 * (pixels - 0.5), input_proj (no bias), plus
    position_embedding_table[0][x] + [1][y] (one_hot @ table, summed over the
    two axes), zero on padding patches;
  - Gemma4VisionEncoder / create_bidirectional_mask: every query sees every
    non-padding key;
  - Gemma4VisionEncoderLayer: input_layernorm, attention,
    post_attention_layernorm, residual; pre_feedforward_layernorm, MLP,
    post_feedforward_layernorm, residual (Gemma4RMSNorm: x * (mean(x^2) +
    eps)^-0.5 * w, no "1 +");
  - Gemma4VisionAttention: q_norm / k_norm with weights, v_norm without,
    apply_multidimensional_rope (the head split in two halves, the first
    rotated by x, the second by y, each with rotate_half), scaling 1.0,
    repeat_kv for grouped KV heads, o_proj;
  - Gemma4VisionRotaryEmbedding.compute_default_rope_parameters:
    inv_freq = 1 / theta^(arange(0, head_dim / 2, 2) / (head_dim / 2));
  - Gemma4ClippableLinear: clamp(input_min, input_max), linear (no bias),
    clamp(output_min, output_max) when use_clipped_linears;
  - Gemma4VisionMLP: down(gelu_tanh(gate(x)) * up(x));
  - Gemma4VisionPooler: padding rows zeroed, _avg_pool_by_positions (one-hot
    weights 1 / k^2 by kernel index x // k + (max_x // k) * (y // k)), then
    times sqrt(hidden_size);
  - Gemma4MultimodalEmbedder: weightless RMSNorm, embedding_projection.
It shares no code with lmserve's C path: it reads config.json with the json
module and the safetensors files by hand (as siglip_ref.py does).

    python3 gemma4_vision_ref.py MODEL_DIR PIXELS POSITIONS ROWS OUT

PIXELS: raw little-endian f32 [sum(ROWS), 3 * patch^2], the images' padded
patch sequences one after another (md_g4_image_preprocess's layout);
POSITIONS: raw little-endian i32 [sum(ROWS), 2] (x, y; -1, -1 on padding);
ROWS: comma-separated rows per image (each max_soft_tokens * pool^2). OUT
receives raw little-endian f32 [sum of soft tokens, text hidden_size]: each
image's embeddings (its valid pooled tokens) in order.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from siglip_ref import read_checkpoint, gelu_pytorch_tanh  # noqa: E402  (file reading only)


def rms_norm(x, w, eps):
    y = x * (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
    return y if w is None else y * w


def clippable_linear(t, clipped, x, name):
    """Gemma4ClippableLinear NAME of the tensors t: clamp, linear (no bias), clamp."""
    if clipped:
        x = np.clip(x, t[name + ".input_min"], t[name + ".input_max"])
    y = x @ t[name + ".linear.weight"].T
    if clipped:
        y = np.clip(y, t[name + ".output_min"], t[name + ".output_max"])
    return y


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


class Tower:
    def __init__(self, cfg, t):
        vc = cfg.get("vision_config") or {}
        self.t = t
        self.D = vc.get("hidden_size", 768)
        self.layers = vc.get("num_hidden_layers", 16)
        self.heads = vc.get("num_attention_heads", 12)
        self.kv_heads = vc.get("num_key_value_heads", self.heads)
        self.hd = vc.get("head_dim", 64)
        self.patch = vc.get("patch_size", 16)
        self.pool = vc.get("pooling_kernel_size", 3)
        self.eps = vc.get("rms_norm_eps", 1e-6)
        self.clipped = vc.get("use_clipped_linears", False)
        self.standardize = vc.get("standardize", False)
        rp = vc.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", 100.0)
        self.vp = "model.vision_tower."
        self.ep = "model.embed_vision."
        spatial = self.hd // 2
        self.inv_freq = 1.0 / (self.theta ** (np.arange(0, spatial, 2, dtype=np.float64) / spatial))

    def linear(self, x, name):
        return clippable_linear(self.t, self.clipped, x, name)

    def rope(self, x, pos):
        # x [L, heads, hd]; pos [L, 2]: apply_multidimensional_rope with
        # cos/sin of cat(freqs, freqs) per axis
        half = self.hd // 2
        parts = []
        for axis in range(2):
            f = pos[:, axis:axis + 1].astype(np.float64) * self.inv_freq[None, :]
            emb = np.concatenate([f, f], axis=-1)  # [L, half]
            cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
            xp = x[..., axis * half:(axis + 1) * half]
            parts.append(xp * cos + rotate_half(xp) * sin)
        return np.concatenate(parts, axis=-1)

    def image(self, pixels, pos):
        """pixels [L, 3 p^2], pos [L, 2] -> its valid soft tokens [n, text hidden]."""
        t, D, L = self.t, self.D, pixels.shape[0]
        pad = np.all(pos == -1, axis=-1)
        # patch embedder
        h = (2.0 * (pixels - 0.5)) @ t[self.vp + "patch_embedder.input_proj.weight"].T
        table = t[self.vp + "patch_embedder.position_embedding_table"]
        cp = np.maximum(pos, 0)
        pe = table[0][cp[:, 0]] + table[1][cp[:, 1]]
        pe[pad] = 0.0
        h = h + pe
        # encoder: bidirectional, padding keys masked
        key_bias = np.where(pad, -np.inf, 0.0)[None, None, :]
        rep = self.heads // self.kv_heads
        for i in range(self.layers):
            lp = self.vp + "encoder.layers.%d." % i
            r = h
            y = rms_norm(h, t[lp + "input_layernorm.weight"], self.eps)
            q = self.linear(y, lp + "self_attn.q_proj").reshape(L, self.heads, self.hd)
            k = self.linear(y, lp + "self_attn.k_proj").reshape(L, self.kv_heads, self.hd)
            v = self.linear(y, lp + "self_attn.v_proj").reshape(L, self.kv_heads, self.hd)
            q = self.rope(rms_norm(q, t[lp + "self_attn.q_norm.weight"], self.eps), pos)
            k = self.rope(rms_norm(k, t[lp + "self_attn.k_norm.weight"], self.eps), pos)
            v = rms_norm(v, None, self.eps)
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) * 1.0 + key_bias
            s = s - s.max(axis=-1, keepdims=True)
            a = np.exp(s)
            a = a / a.sum(axis=-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", a, v).reshape(L, self.heads * self.hd)
            o = self.linear(o, lp + "self_attn.o_proj")
            h = r + rms_norm(o, t[lp + "post_attention_layernorm.weight"], self.eps)
            r = h
            y = rms_norm(h, t[lp + "pre_feedforward_layernorm.weight"], self.eps)
            g = gelu_pytorch_tanh(self.linear(y, lp + "mlp.gate_proj")) * self.linear(y, lp + "mlp.up_proj")
            y = self.linear(g, lp + "mlp.down_proj")
            h = r + rms_norm(y, t[lp + "post_feedforward_layernorm.weight"], self.eps)
        # pooler
        length = L // (self.pool * self.pool)
        h = np.where(pad[:, None], 0.0, h)
        if L != length:
            k = int((L // length) ** 0.5)
            max_x = cp[:, 0].max() + 1
            idx = cp[:, 0] // k + (max_x // k) * (cp[:, 1] // k)
            w = np.zeros((L, length))
            w[np.arange(L), idx] = 1.0 / (k * k)
            h = w.T @ h
            valid = ~np.all(w == 0, axis=0)
        else:
            valid = ~pad
        h = h * D ** 0.5
        h = h[valid]
        if self.standardize:
            h = (h - t[self.vp + "std_bias"]) * t[self.vp + "std_scale"]
        # embedder
        h = rms_norm(h, None, self.eps)
        return h @ t[self.ep + "embedding_projection.weight"].T


def main(argv):
    if len(argv) != 6:
        sys.stderr.write(__doc__)
        return 2
    model_dir, px_path, pos_path, rows_arg, out_path = argv[1:]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tower = Tower(cfg, read_checkpoint(model_dir))
    rows = [int(r) for r in rows_arg.split(",")]
    pd = 3 * tower.patch * tower.patch
    px = np.fromfile(px_path, dtype="<f4").astype(np.float64).reshape(sum(rows), pd)
    pos = np.fromfile(pos_path, dtype="<i4").astype(np.int64).reshape(sum(rows), 2)
    outs, at = [], 0
    for r in rows:
        outs.append(tower.image(px[at:at + r], pos[at:at + r]))
        at += r
    out = np.concatenate(outs, axis=0)
    out.astype("<f4").tofile(out_path)
    print("gemma4_vision_ref: %d images -> %s embeddings" % (len(rows), "x".join(map(str, out.shape))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
