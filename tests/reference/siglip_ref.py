#!/usr/bin/env python3
"""siglip_ref.py — an independent numpy reference for Gemma 3's image encoder.

Written from Hugging Face transformers' modeling_siglip.py (SiglipVisionModel:
SiglipVisionEmbeddings, SiglipEncoderLayer, post_layernorm) and
modeling_gemma3.py (Gemma3MultiModalProjector, Gemma3RMSNorm), in float64. It
shares no code with lmserve's C path: it reads config.json with the json
module and the safetensors files by hand (8-byte little-endian header length,
JSON header, raw little-endian tensor data; bf16 is the upper half of an f32).

    python3 siglip_ref.py MODEL_DIR PIXELS N_IMAGES OUT

PIXELS: raw little-endian f32 [N_IMAGES, num_channels, image_size, image_size]
(already preprocessed). OUT receives raw little-endian f32
[N_IMAGES * mm_tokens_per_image, text hidden_size]: the image embeddings that
replace the image tokens' rows.
"""
import json
import os
import struct
import sys

import numpy as np


# ---- safetensors ---------------------------------------------------------------

def read_safetensors(path):
    """{name: float64 array} of every float tensor in one .safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        raw = data[base + begin:base + end]
        shape = tuple(meta["shape"])
        dt = meta["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue  # integer tensors (none in a vision tower)
        out[name] = arr.astype(np.float64).reshape(shape)
    return out


def checkpoint_files(model_dir):
    """The checkpoint's .safetensors files: the index's, else model.safetensors."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def read_checkpoint(model_dir):
    tensors = {}
    for name in checkpoint_files(model_dir):
        tensors.update(read_safetensors(os.path.join(model_dir, name)))
    return tensors


# ---- the model ------------------------------------------------------------------

def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_pytorch_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def linear(x, w, b):
    # nn.Linear: x @ W^T + b, W [out, in]
    return x @ w.T + b


def encode(cfg, t, pixels):
    vc = cfg.get("vision_config", {})
    D = vc.get("hidden_size", 768)
    n_layers = vc.get("num_hidden_layers", 12)
    heads = vc.get("num_attention_heads", 12)
    image = vc.get("image_size", 224)
    p = vc.get("patch_size", 16)
    eps = vc.get("layer_norm_eps", 1e-6)
    mm_tokens = cfg.get("mm_tokens_per_image", 256)
    hd = D // heads

    if "model.vision_tower.vision_model.embeddings.patch_embedding.weight" in t:
        vp, pp = "model.vision_tower.vision_model.", "model.multi_modal_projector."
    else:
        vp, pp = "vision_tower.vision_model.", "multi_modal_projector."

    n, C = pixels.shape[0], pixels.shape[1]
    g = image // p
    # SiglipVisionEmbeddings: Conv2d(stride = kernel = patch, "valid"), then
    # flatten(2).transpose(1, 2): patch (row, col) -> token row * g + col
    x = pixels[:, :, :g * p, :g * p].reshape(n, C, g, p, g, p)
    w = t[vp + "embeddings.patch_embedding.weight"]  # [D, C, p, p]
    conv = np.einsum("ncypxq,dcpq->nyxd", x, w) + t[vp + "embeddings.patch_embedding.bias"]
    h = conv.reshape(n, g * g, D)
    h = h + t[vp + "embeddings.position_embedding.weight"][None, :, :]

    for i in range(n_layers):
        lp = vp + "encoder.layers.%d." % i
        # SiglipEncoderLayer: pre-norm residual blocks
        r = h
        y = layer_norm(h, t[lp + "layer_norm1.weight"], t[lp + "layer_norm1.bias"], eps)
        q = linear(y, t[lp + "self_attn.q_proj.weight"], t[lp + "self_attn.q_proj.bias"])
        k = linear(y, t[lp + "self_attn.k_proj.weight"], t[lp + "self_attn.k_proj.bias"])
        v = linear(y, t[lp + "self_attn.v_proj.weight"], t[lp + "self_attn.v_proj.bias"])
        q = q.reshape(n, -1, heads, hd).transpose(0, 2, 1, 3)
        k = k.reshape(n, -1, heads, hd).transpose(0, 2, 1, 3)
        v = v.reshape(n, -1, heads, hd).transpose(0, 2, 1, 3)
        s = (q @ k.transpose(0, 1, 3, 2)) * hd ** -0.5  # no mask: bidirectional
        s = s - s.max(axis=-1, keepdims=True)
        a = np.exp(s)
        a = a / a.sum(axis=-1, keepdims=True)
        o = (a @ v).transpose(0, 2, 1, 3).reshape(n, -1, D)
        h = r + linear(o, t[lp + "self_attn.out_proj.weight"], t[lp + "self_attn.out_proj.bias"])
        r = h
        y = layer_norm(h, t[lp + "layer_norm2.weight"], t[lp + "layer_norm2.bias"], eps)
        y = gelu_pytorch_tanh(linear(y, t[lp + "mlp.fc1.weight"], t[lp + "mlp.fc1.bias"]))
        h = r + linear(y, t[lp + "mlp.fc2.weight"], t[lp + "mlp.fc2.bias"])
    h = layer_norm(h, t[vp + "post_layernorm.weight"], t[vp + "post_layernorm.bias"], eps)

    # Gemma3MultiModalProjector: [n, N, D] -> [n, D, g, g], AvgPool2d(kernel =
    # stride = g // sqrt(mm_tokens)), flatten, transpose back
    side = int(mm_tokens ** 0.5)
    kern = g // side
    os_ = g // kern
    grid = h.transpose(0, 2, 1).reshape(n, D, g, g)[:, :, :os_ * kern, :os_ * kern]
    pooled = grid.reshape(n, D, os_, kern, os_, kern).mean(axis=(3, 5))
    pooled = pooled.reshape(n, D, os_ * os_).transpose(0, 2, 1)
    # Gemma3RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w)
    ms = (pooled ** 2).mean(axis=-1, keepdims=True)
    normed = pooled / np.sqrt(ms + eps) * (1.0 + t[pp + "mm_soft_emb_norm.weight"])
    # torch.matmul(normed, mm_input_projection_weight): W [D, text hidden], not transposed
    emb = normed @ t[pp + "mm_input_projection_weight"]
    return emb.reshape(n * emb.shape[1], emb.shape[2])


def main(argv):
    if len(argv) != 5:
        sys.stderr.write(__doc__)
        return 2
    model_dir, pixels_path, n_images, out_path = argv[1], argv[2], int(argv[3]), argv[4]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    vc = cfg.get("vision_config", {})
    C, S = vc.get("num_channels", 3), vc.get("image_size", 224)
    pixels = np.fromfile(pixels_path, dtype="<f4").astype(np.float64)
    pixels = pixels.reshape(n_images, C, S, S)
    emb = encode(cfg, read_checkpoint(model_dir), pixels)
    emb.astype("<f4").tofile(out_path)
    print("siglip_ref: %d images -> %s embeddings" % (n_images, "x".join(map(str, emb.shape))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
