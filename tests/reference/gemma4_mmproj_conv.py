#!/usr/bin/env python3
"""gemma4_mmproj_conv.py — writes a Gemma4ForConditionalGeneration checkpoint's
vision and audio towers as llama.cpp's converter writes its mmproj file, as an
independent reference for lmserve's reading of such files (it shares no code
with lmserve's C exporter or reader).

Written from llama.cpp's conversion/gemma.py (Gemma4VisionAudioModel, on
MmprojModel in conversion/base.py) and gguf-py (constants.py's tensor names,
tensor_mapping.py's map, gguf_writer.py's layout), step by step as
modify_tensors does it with --outtype f16:
  - the audio tower's names: "model.audio_tower." becomes "conformer.",
    ".linear." goes; per_dim_scale gets ".weight" and softplus; the
    depthwise kernel [C, 1, K] is reshaped to [C, K];
  - the vision tower's: "model.vision_tower.encoder." becomes
    "vision_model.model.", ".linear.weight" becomes ".weight";
    position_embedding_table gets ".weight"; the patch projection
    [D, 3 p^2] (inputs (y, x, c)) is reshaped to [D, p, p, 3] and permuted to
    [D, 3, p, p];
  - 0-d tensors (the clip bounds) become [1];
  - then tensor_mapping.py's names (below, the Gemma 4 rows), the suffixes
    .weight, .bias, .input_min, .input_max, .output_min, .output_max kept;
  - dtypes: f32 for the audio tower's convolution tensors (".conv" in the
    name, or "_conv" with ".weight"), the position table, 1-D tensors,
    "_norm.weight" names and names not ending in ".weight"; f16 for the rest,
    the patch projection included;
  - keys: general.architecture "clip", general.type "mmproj",
    general.file_type 1, clip.has_vision_encoder, clip.vision.* (image_size
    forced to 224, image_mean 0 / image_std 1, projector_type "gemma4v",
    attention.layer_norm_epsilon from layer_norm_eps or 1e-6),
    clip.has_audio_encoder, clip.audio.* (projector_type "gemma4a",
    num_mel_bins from input_feat_size or 128, feed_forward_length 4 x the
    width, attention.layer_norm_epsilon 1e-5).
GGUF v3, little-endian, tensors aligned to 32 bytes, dimensions innermost
first.

    python3 gemma4_mmproj_conv.py MODEL_DIR OUT.gguf
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from siglip_ref import read_checkpoint  # noqa: E402  (file reading only)

# tensor_mapping.py's rows for Gemma 4's towers: the name after the converter's
# renames (its {bid} as N) -> gguf-py's name
VISION_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_out", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "ln1",
    "post_attention_layernorm": "attn_post_norm", "pre_feedforward_layernorm": "ln2",
    "post_feedforward_layernorm": "ffn_post_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "layer_scalar": "out_scale",
}
AUDIO_LAYER = {
    "feed_forward1.pre_layer_norm": "ffn_norm", "feed_forward1.ffw_layer_1": "ffn_up",
    "feed_forward1.ffw_layer_2": "ffn_down", "feed_forward1.post_layer_norm": "ffn_post_norm",
    "feed_forward2.pre_layer_norm": "ffn_norm_1", "feed_forward2.ffw_layer_1": "ffn_up_1",
    "feed_forward2.ffw_layer_2": "ffn_down_1", "feed_forward2.post_layer_norm": "ffn_post_norm_1",
    "norm_pre_attn": "attn_pre_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.post": "attn_out",
    "self_attn.relative_k_proj": "attn_k_rel", "self_attn.per_dim_scale": "per_dim_scale",
    "norm_post_attn": "attn_post_norm", "lconv1d.pre_layer_norm": "conv_norm",
    "lconv1d.linear_start": "conv_pw1", "lconv1d.depthwise_conv1d": "conv_dw",
    "lconv1d.conv_norm": "norm_conv", "lconv1d.linear_end": "conv_pw2", "norm_out": "ln2",
}
TOP = {
    "model.vision_tower.patch_embedder.input_proj": "v.patch_embd",
    "model.vision_tower.patch_embedder.position_embedding_table": "v.position_embd",
    "model.vision_tower.std_bias": "v.std_bias",
    "model.vision_tower.std_scale": "v.std_scale",
    "model.embed_vision.embedding_projection": "mm.input_projection",
    "conformer.subsample_conv_projection.layer0.conv": "a.conv1d.0",
    "conformer.subsample_conv_projection.layer1.conv": "a.conv1d.1",
    "conformer.subsample_conv_projection.layer0.norm": "a.conv1d.0.norm",
    "conformer.subsample_conv_projection.layer1.norm": "a.conv1d.1.norm",
    "conformer.subsample_conv_projection.input_proj_linear": "a.input_projection",
    "conformer.output_proj": "a.pre_encode.out",
    "model.embed_audio.embedding_projection": "mm.a.input_projection",
}
SUFFIXES = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")


def map_name(name):
    """tensor_mapping.py's lookup: the whole name, else without a known suffix
    (added back after)."""
    for suf in ("",) + SUFFIXES:
        if suf and not name.endswith(suf):
            continue
        base = name[: len(name) - len(suf)] if suf else name
        if base in TOP:
            return TOP[base] + suf
        for prefix, table, out in (("vision_model.model.layers.", VISION_LAYER, "v.blk."),
                                   ("conformer.layers.", AUDIO_LAYER, "a.blk.")):
            if base.startswith(prefix):
                n, _, rest = base[len(prefix):].partition(".")
                if rest in table:
                    return "%s%s.%s%s" % (out, n, table[rest], suf)
    raise SystemExit("can not map tensor %r" % name)


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def convert(t, name):
    """modify_tensors: [(gguf name, array, is_audio)] for one checkpoint tensor."""
    if t.ndim == 0:
        t = t.reshape(1)
    if "audio_tower" in name or "embed_audio" in name:
        name = name.replace("model.audio_tower.", "conformer.").replace(".linear.", ".")
        if name.endswith("per_dim_key_scale") or name.endswith("per_dim_scale"):
            name += ".weight"
            t = softplus(t)
        if "lconv1d.depthwise_conv1d" in name and name.endswith(".weight"):
            assert t.shape[1] == 1
            t = t.reshape(t.shape[0], t.shape[2])
        return map_name(name), t, True
    name = name.replace("model.vision_tower.encoder.", "vision_model.model.")
    name = name.replace(".linear.weight", ".weight")
    if name.endswith("layer_scalar") or name.endswith("position_embedding_table"):
        name += ".weight"
    if name.endswith("patch_embedder.input_proj.weight"):
        n_embd, ksize_sq_c = t.shape
        p = int(round((ksize_sq_c // 3) ** 0.5))
        t = t.reshape(n_embd, p, p, 3).transpose(0, 3, 1, 2)
    return map_name(name), t, False


def f32_forced(hf_name, gname, t, audio):
    if audio and (".conv" in hf_name or ("_conv" in hf_name and ".weight" in hf_name)):
        return True
    if "position_embedding_table" in hf_name:
        return True
    return t.ndim <= 1 or gname.endswith("_norm.weight") or not gname.endswith(".weight")


class Writer:
    def __init__(self):
        self.kv = []
        self.tensors = []

    def key(self, k, typ, payload):
        self.kv.append(struct.pack("<Q", len(k)) + k.encode() + struct.pack("<I", typ) + payload)

    def u32(self, k, v):
        self.key(k, 4, struct.pack("<I", v))

    def f32(self, k, v):
        self.key(k, 6, struct.pack("<f", v))

    def boolean(self, k, v):
        self.key(k, 7, struct.pack("<B", 1 if v else 0))

    def string(self, k, v):
        self.key(k, 8, struct.pack("<Q", len(v)) + v.encode())

    def f32s(self, k, vs):
        self.key(k, 9, struct.pack("<IQ", 6, len(vs)) + struct.pack("<%df" % len(vs), *vs))

    def write(self, path):
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)) + b"".join(self.kv)
        infos, blobs, off = b"", [], 0
        for name, arr, typ in self.tensors:
            data = arr.astype("<f4" if typ == 0 else "<f2").tobytes()
            dims = arr.shape[::-1]
            infos += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
            infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, off)
            blobs.append(data + b"\0" * (-len(data) % 32))
            off += len(blobs[-1])
        out = head + infos
        out += b"\0" * (-len(out) % 32)
        with open(path, "wb") as f:
            f.write(out + b"".join(blobs))


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    text_hidden = cfg["text_config"]["hidden_size"]
    vc, ac = cfg.get("vision_config"), cfg.get("audio_config")
    w = Writer()
    w.string("general.architecture", "clip")
    w.string("general.type", "mmproj")
    w.u32("general.file_type", 1)
    if vc:
        w.boolean("clip.has_vision_encoder", True)
        w.u32("clip.vision.projection_dim", text_hidden)
        w.u32("clip.vision.image_size", 224)
        w.u32("clip.vision.patch_size", vc["patch_size"])
        w.u32("clip.vision.embedding_length", vc["hidden_size"])
        w.u32("clip.vision.feed_forward_length", vc["intermediate_size"])
        w.u32("clip.vision.block_count", vc["num_hidden_layers"])
        w.u32("clip.vision.attention.head_count", vc["num_attention_heads"])
        w.f32s("clip.vision.image_mean", [0.0, 0.0, 0.0])
        w.f32s("clip.vision.image_std", [1.0, 1.0, 1.0])
        w.string("clip.vision.projector_type", "gemma4v")
        w.f32("clip.vision.attention.layer_norm_epsilon", vc.get("layer_norm_eps", 1e-6))
    if ac:
        w.boolean("clip.has_audio_encoder", True)
        w.u32("clip.audio.projection_dim", text_hidden)
        w.u32("clip.audio.embedding_length", ac["hidden_size"])
        w.u32("clip.audio.feed_forward_length", ac["hidden_size"] * 4)
        w.u32("clip.audio.block_count", ac["num_hidden_layers"])
        w.u32("clip.audio.attention.head_count", ac["num_attention_heads"])
        w.string("clip.audio.projector_type", "gemma4a")
        w.u32("clip.audio.num_mel_bins", ac.get("input_feat_size", 128))
        w.f32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    tensors = read_checkpoint(model_dir)
    for name in sorted(tensors):
        if "language_model." in name:  # filter_tensors: the text model is not in the file
            continue
        gname, t, audio = convert(tensors[name], name)
        typ = 0 if f32_forced(name, gname, t, audio) else 1
        w.tensors.append((gname, np.ascontiguousarray(t), typ))
    w.write(out)


if __name__ == "__main__":
    main()
