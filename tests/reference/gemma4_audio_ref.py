#!/usr/bin/env python3
"""Gemma 4 audio front end, float64 numpy reference (independent of model/md-audio-g4.c).

Written from transformers' source (models/gemma4/), following:
  - feature_extraction_gemma4.py: Gemma4AudioFeatureExtractor.__init__ (frame and hop
    lengths rounded from milliseconds, fft_length the next power of two, doubled with
    fft_overdrive; periodic Hann window; HTK mel filters without norm),
    Gemma4AudioFeatureExtractor._extract_spectrogram (semicausal left padding of
    frame_length // 2, frames of frame_length + 1 every hop, preemphasis in both
    flavours, window, rfft zero-padded to fft_length, magnitude, mel matmul,
    log(mel + mel_floor), per-bin mean and stddev, the frame mask from each window's
    last sample) and Gemma4AudioFeatureExtractor.__call__ (max_length 480000,
    truncation, pad_to_multiple_of 128, features times the mask);
  - feature_extraction_sequence_utils.py: SequenceFeatureExtractor.pad / _truncate /
    _pad for one input with padding "longest" (truncate to max_length, then zero-pad
    on the right to a multiple of pad_to_multiple_of, attention mask 1 on real samples);
  - audio_utils.py: window_function (hann, periodic), hertz_to_mel / mel_to_hertz
    (htk), mel_filter_bank (fft bin frequencies linspace(0, sr // 2, bins)) and
    _create_triangular_filter_bank;
  - processing_gemma4.py: Gemma4Processor.replace_audio_token (the mask subsampled
    by the two stride-2 convolutions, its sum is the number of soft tokens).
Everything here is float64 (transformers casts the window and the output to float32).

The encoder (the "encode" command) follows transformers' models/gemma4/modeling_gemma4.py
(commit 0246b4f) literally, batched as there (clips padded to the longest, the masks
doing the rest), in float64:
  - Gemma4AudioModel.forward: subsample_conv_projection, rel_pos_enc, the bidirectional
    mask of the subsampled frame mask and-ed with sliding_window_mask_function
    ((attention_context_left - 1, attention_context_right)), _convert_4d_mask_to_blocked_5d,
    the layers, output_proj (with bias);
  - Gemma4AudioSubSampleConvProjectionLayer: features times the mask, Conv2d 3x3 stride 2
    padding 1 without bias, LayerNorm over channels (weight, no bias, eps rms_norm_eps),
    ReLU, the mask subsampled as mask[:, ::2]; Gemma4AudioSubSampleConvProjection: two of
    them, [B, C, T, F] permuted to [B, T, F, C] and flattened, input_proj_linear;
  - Gemma4AudioRelPositionalEncoding: positions context_size // 2 .. 0, [sin, cos] with
    inv_timescales exp(-i log(10000) / (hidden / 2 - 1));
  - Gemma4AudioAttention: q times head_dim^-0.5 / ln 2 times softplus(per_dim_scale),
    k times ln(1 + e) / ln 2, _convert_to_block, _extract_block_context (unfold),
    matrix_ac + _rel_shift(matrix_bd) with relative_k_proj of the position embeddings,
    tanh logit cap, masked_fill with attention_invalid_logits_value, softmax, post;
  - Gemma4AudioFeedForward (the clamps at min(gradient_clipping, the weight dtype's
    largest value), pre_layer_norm, ffw_layer_1, hidden_act, ffw_layer_2,
    post_layer_norm, times residual_weight, residual), Gemma4AudioLightConv1d
    (pre_layer_norm, linear_start, GLU, Gemma4AudioCausalConv1d: depthwise, left padding
    kernel - 1, clamp, conv_norm, hidden_act, linear_end, residual), Gemma4AudioLayer
    (feed_forward1, clamp, norm_pre_attn, attention, clamp, norm_post_attn, residual,
    lconv1d, feed_forward2, clamp, norm_out); the norms the layer and the feed-forward
    make without an eps have Gemma4RMSNorm's default 1e-6;
  - Gemma4ClippableLinear (clamp to input_min/max, linear, clamp to output_min/max when
    use_clipped_linears), Gemma4RMSNorm (x (mean(x^2) + eps)^-1/2 w);
  - Gemma4Model.get_audio_features / forward: embed_audio (Gemma4MultimodalEmbedder:
    weightless RMSNorm with the audio rms_norm_eps, embedding_projection) and only the
    valid tokens (the encoder's output mask) kept.
It reads config.json with the json module and the safetensors files by hand
(siglip_ref.read_checkpoint).

Usage:
  gemma4_audio_ref.py features CONFIG.json IN.f32 OUT.bin
      IN.f32: raw little-endian float32 samples (16 kHz mono). CONFIG.json: the
      extractor's fields ({} for the defaults). Writes OUT.bin: frames x feature_size
      float64 features, then frames mask bytes; prints "FRAMES TOKENS".
  gemma4_audio_ref.py encode MODEL_DIR FEAT.f32 MASK.u8 FRAMES OUT.f32
      FEAT.f32: raw little-endian float32 features [sum(FRAMES), feature_size] of the
      clips one after another, MASK.u8 their frame masks (one byte a frame); FRAMES:
      comma-separated frames per clip. Writes OUT.f32: raw little-endian float32
      [sum of soft tokens, text hidden_size], the clips' valid embeddings in order;
      prints each clip's soft tokens (comma-separated).
"""
import json
import math
import os
import struct
import sys

import numpy as np


class Extractor:
    def __init__(self, cfg):
        g = cfg.get
        self.n_mel = int(g("feature_size", 128))
        self.sr = int(g("sampling_rate", 16000))
        self.min_f = float(g("min_frequency", 0.0))
        self.max_f = float(g("max_frequency", 8000.0))
        self.pre = float(g("preemphasis", 0.0))
        self.pre_htk = bool(g("preemphasis_htk_flavor", True))
        self.scale = float(g("input_scale_factor", 1.0))
        self.floor = float(g("mel_floor", 1e-3))
        self.max_length = int(g("max_length", 480000))
        self.multiple = int(g("pad_to_multiple_of", 128))
        self.frame = int(round(self.sr * float(g("frame_length_ms", 20.0)) / 1000.0))
        self.hop = int(round(self.sr * float(g("hop_length_ms", 10.0)) / 1000.0))
        self.nfft = 2 ** math.ceil(math.log2(self.frame)) * (2 if g("fft_overdrive", False) else 1)
        mean, std = g("per_bin_mean"), g("per_bin_stddev")
        self.mean = None if mean is None else np.asarray(mean, np.float64)
        self.std = None if std is None else np.asarray(std, np.float64)

    def window(self):
        n = np.arange(self.frame, dtype=np.float64)
        return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / self.frame)

    def mel_filters(self):
        def to_mel(f):
            return 2595.0 * np.log10(1.0 + f / 700.0)

        def to_hz(m):
            return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

        bins = self.nfft // 2 + 1
        edges = to_hz(np.linspace(to_mel(self.min_f), to_mel(self.max_f), self.n_mel + 2))
        freqs = np.linspace(0.0, self.sr // 2, bins)
        d = np.diff(edges)
        rel = edges[None, :] - freqs[:, None]  # [bins, n_mel + 2]
        down = -rel[:, :-2] / d[:-1]
        up = rel[:, 2:] / d[1:]
        return np.maximum(0.0, np.minimum(down, up))  # [bins, n_mel]

    def __call__(self, pcm):
        x = np.asarray(pcm, np.float64)[: self.max_length]
        n = len(x)
        total = -(-n // self.multiple) * self.multiple
        valid = np.zeros(total, bool)
        valid[:n] = True
        x = np.concatenate([x, np.zeros(total - n)]) * self.scale
        left = self.frame // 2
        x = np.concatenate([np.zeros(left), x])
        valid = np.concatenate([np.zeros(left, bool), valid])
        size = self.frame + 1
        frames = (len(x) - size) // self.hop + 1 if len(x) >= size else 0
        if frames == 0:
            return np.zeros((0, self.n_mel)), np.zeros(0, bool)
        idx = np.arange(frames)[:, None] * self.hop + np.arange(size)[None, :]
        w = x[idx]  # [frames, frame + 1]
        if self.pre > 0:
            if self.pre_htk:
                w = np.concatenate([w[:, :1] * (1.0 - self.pre), w[:, 1:-1] - self.pre * w[:, :-2]], 1)
            else:
                w = w[:, 1:] - self.pre * w[:, :-1]
        else:
            w = w[:, :-1]
        spec = np.abs(np.fft.rfft(w * self.window(), n=self.nfft, axis=-1))
        logmel = np.log(spec @ self.mel_filters() + self.floor)
        if self.mean is not None:
            logmel = logmel - self.mean[None, :]
        if self.std is not None:
            logmel = logmel / self.std[None, :]
        mask = valid[np.arange(frames) * self.hop + size - 1]
        return logmel * mask[:, None], mask


def soft_tokens(mask):
    m = np.asarray(mask)
    for _ in range(2):
        t = len(m)
        m = m[::2][: (t + 2 - 3) // 2 + 1]
    return int(m.sum())


# ---- the encoder ------------------------------------------------------------------

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma4_vision_ref import clippable_linear, rms_norm  # noqa: E402  (Gemma4RMSNorm, Gemma4ClippableLinear)

F32_MAX = float(np.finfo(np.float32).max)
DTYPE_MAX = {"F32": F32_MAX, "BF16": 3.3895313892515355e38, "F16": 65504.0}


def read_dtypes(model_dir):
    """{name: safetensors dtype} over the checkpoint's files (headers only)."""
    from siglip_ref import checkpoint_files
    out = {}
    for name in checkpoint_files(model_dir):
        with open(os.path.join(model_dir, name), "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen).decode("utf-8"))
        out.update({k: v["dtype"] for k, v in header.items() if k != "__metadata__"})
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.log1p(np.exp(x))


class AudioTower:
    def __init__(self, cfg, t, dtypes):
        ac = cfg.get("audio_config") or {}
        g = ac.get
        self.t, self.dtypes = t, dtypes
        self.H = g("hidden_size", 1024)
        self.layers = g("num_hidden_layers", 12)
        self.heads = g("num_attention_heads", 8)
        self.hd = self.H // self.heads
        self.act = g("hidden_act", "silu")
        self.channels = list(g("subsampling_conv_channels", [128, 32]))
        self.kernel = g("conv_kernel_size", 5)
        self.residual_weight = g("residual_weight", 0.5)
        self.chunk = g("attention_chunk_size", 12)
        self.left = g("attention_context_left", 13)
        self.right = g("attention_context_right", 0)
        self.cap = g("attention_logit_cap", 50.0)
        self.invalid = g("attention_invalid_logits_value", -1.0e9)
        self.clipped = g("use_clipped_linears", True)
        self.eps = g("rms_norm_eps", 1e-6)
        self.grad_clip = g("gradient_clipping", 1e10)
        self.out_dims = g("output_proj_dims", 1536)
        if self.act != "silu":
            raise SystemExit("gemma4_audio_ref: hidden_act %s not modelled" % self.act)
        if "model.audio_tower.output_proj.weight" in t:
            self.ap, self.ep = "model.audio_tower.", "model.embed_audio."
        else:
            self.ap, self.ep = "audio_tower.", "embed_audio."
        # the attention's shape (Gemma4AudioAttention.__init__)
        self.past = self.left - 1
        self.future = self.right
        self.context = self.chunk + self.past + self.future
        self.q_scale = (self.hd ** -0.5) / math.log(2)
        self.k_scale = math.log(1 + math.e) / math.log(2)

    def clip_value(self, weight_name):
        return min(self.grad_clip, DTYPE_MAX[self.dtypes[weight_name]])

    def linear(self, x, name):
        return clippable_linear(self.t, self.clipped, x, name)

    # Gemma4AudioSubSampleConvProjectionLayer
    def conv_layer(self, x, mask, name):
        t = self.t
        x = x * mask[:, None, :, None]
        w = t[name + ".conv.weight"]  # [Co, Ci, 3, 3]
        B, Ci, T, F = x.shape
        To, Fo = (T + 2 - 3) // 2 + 1, (F + 2 - 3) // 2 + 1
        xp = np.zeros((B, Ci, T + 2, F + 2))
        xp[:, :, 1:T + 1, 1:F + 1] = x
        out = np.zeros((B, w.shape[0], To, Fo))
        for kt in range(3):
            for kf in range(3):
                patch = xp[:, :, kt:kt + 2 * To - 1:2, kf:kf + 2 * Fo - 1:2]
                out += np.einsum("bitf,oi->botf", patch, w[:, :, kt, kf])
        y = out.transpose(0, 2, 3, 1)  # LayerNorm over channels
        mu = y.mean(axis=-1, keepdims=True)
        var = ((y - mu) ** 2).mean(axis=-1, keepdims=True)
        y = (y - mu) / np.sqrt(var + self.eps) * t[name + ".norm.weight"]
        y = np.maximum(y, 0.0).transpose(0, 3, 1, 2)
        return y, mask[:, ::2]

    def subsample(self, feat, mask):
        p = self.ap + "subsample_conv_projection."
        x, mask = self.conv_layer(feat[:, None, :, :], mask, p + "layer0")
        x, mask = self.conv_layer(x, mask, p + "layer1")
        B, C, T, F = x.shape
        x = x.transpose(0, 2, 3, 1).reshape(B, T, F * C)
        return x @ self.t[p + "input_proj_linear.weight"].T, mask

    def position_embeddings(self):
        n = self.H // 2
        inc = math.log(10000.0 / 1.0) / max(n - 1, 1)
        inv = np.exp(np.arange(n) * -inc)
        pos = np.arange(self.context // 2, -1, -1, dtype=np.float64)[:, None]
        return np.concatenate([np.sin(pos * inv), np.cos(pos * inv)], axis=-1)

    def blocked_mask(self, valid):
        """The [B, S, S] bidirectional mask (valid keys, sliding window) as
        _convert_4d_mask_to_blocked_5d makes it: [B, blocks, chunk, context]."""
        B, S = valid.shape
        d = np.arange(S)[:, None] - np.arange(S)[None, :]
        left, right = self.past, self.future
        window = ((d >= 0) & (d < left)) | ((d < 0) & (-d < right))
        m4 = window[None, :, :] & valid[:, None, :]
        nb = (S + self.chunk - 1) // self.chunk
        Sp = nb * self.chunk
        m = np.zeros((B, Sp, Sp), bool)
        m[:, :S, :S] = m4
        m = m.reshape(B, nb, self.chunk, Sp)
        m = np.concatenate([np.zeros((B, nb, self.chunk, left), bool), m,
                            np.zeros((B, nb, self.chunk, right), bool)], axis=-1)
        idx = np.arange(nb)[:, None] * self.chunk + np.arange(self.context)[None, :]
        return np.take_along_axis(m, np.broadcast_to(idx[None, :, None, :], (B, nb, self.chunk, self.context)), -1)

    def attention(self, x, pe, mask5, name):
        t, N, hd, C, W = self.t, self.heads, self.hd, self.chunk, self.context
        B, S, _ = x.shape
        q = self.linear(x, name + ".q_proj").reshape(B, S, N, hd)
        k = self.linear(x, name + ".k_proj").reshape(B, S, N, hd)
        v = self.linear(x, name + ".v_proj").reshape(B, S, N, hd)
        q = q * self.q_scale * softplus(t[name + ".per_dim_scale"])
        k = k * self.k_scale
        nb = (S + C - 1) // C
        qb = np.zeros((B, nb * C, N, hd))
        qb[:, :S] = q
        qb = qb.reshape(B, nb, C, N, hd)

        def context(z):  # _extract_block_context
            zp = np.concatenate([np.zeros((B, self.past, N, hd)), z,
                                 np.zeros((B, self.future + C - 1, N, hd))], axis=1)
            return np.stack([zp[:, b * C:b * C + W] for b in range(nb)], axis=1)  # [B, nb, W, N, hd]

        kb, vb = context(k), context(v)
        rel = (pe @ t[name + ".relative_k_proj.weight"].T).reshape(-1, N, hd)  # [L, N, hd]
        queries = qb.transpose(0, 3, 1, 2, 4)  # [B, N, nb, C, hd]
        ac = queries @ kb.transpose(0, 3, 1, 4, 2)  # [B, N, nb, C, W]
        bd = queries.reshape(B, N, nb * C, hd) @ rel.transpose(1, 2, 0)  # [B, N, nb C, L]
        L = bd.shape[-1]
        bd = bd.reshape(B, N, nb, C, L)
        # _rel_shift
        bd = np.concatenate([bd, np.zeros((B, N, nb, C, W + 1 - L))], axis=-1)
        bd = bd.reshape(B, N, nb, C * (W + 1))[..., :C * W].reshape(B, N, nb, C, W)
        s = ac + bd
        s = np.tanh(s / self.cap) * self.cap
        s = np.where(mask5[:, None], s, self.invalid)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=-1, keepdims=True)
        o = p @ vb.transpose(0, 3, 1, 2, 4)  # [B, N, nb, C, hd]
        o = o.transpose(0, 2, 3, 1, 4).reshape(B, nb * C, N * hd)[:, :S]
        return self.linear(o, name + ".post")

    def feed_forward(self, x, name):
        t = self.t
        clip = self.clip_value(name + ".ffw_layer_1.linear.weight")
        r = x
        h = rms_norm(np.clip(x, -clip, clip), t[name + ".pre_layer_norm.weight"], 1e-6)
        h = self.linear(silu(self.linear(h, name + ".ffw_layer_1")), name + ".ffw_layer_2")
        h = rms_norm(np.clip(h, -clip, clip), t[name + ".post_layer_norm.weight"], 1e-6)
        return h * self.residual_weight + r

    def light_conv(self, x, name):
        t = self.t
        r = x
        h = rms_norm(x, t[name + ".pre_layer_norm.weight"], self.eps)
        h = self.linear(h, name + ".linear_start")
        h = h[..., :self.H] * (1.0 / (1.0 + np.exp(-h[..., self.H:])))  # glu
        w = t[name + ".depthwise_conv1d.weight"]  # [H, 1, K]
        K = w.shape[-1]
        B, S, _ = h.shape
        hp = np.concatenate([np.zeros((B, K - 1, self.H)), h], axis=1)
        h = sum(hp[:, j:j + S] * w[:, 0, j] for j in range(K))
        clip = self.clip_value(name + ".linear_start.linear.weight")
        h = rms_norm(np.clip(h, -clip, clip), t[name + ".conv_norm.weight"], self.eps)
        return self.linear(silu(h), name + ".linear_end") + r

    def layer(self, x, pe, mask5, name):
        t = self.t
        clip = self.clip_value(name + ".norm_pre_attn.weight")
        x = self.feed_forward(x, name + ".feed_forward1")
        r = x
        h = rms_norm(np.clip(x, -clip, clip), t[name + ".norm_pre_attn.weight"], 1e-6)
        h = self.attention(h, pe, mask5, name + ".self_attn")
        x = rms_norm(np.clip(h, -clip, clip), t[name + ".norm_post_attn.weight"], 1e-6) + r
        x = self.light_conv(x, name + ".lconv1d")
        x = self.feed_forward(x, name + ".feed_forward2")
        return rms_norm(np.clip(x, -clip, clip), t[name + ".norm_out.weight"], 1e-6)

    def __call__(self, feat, mask):
        """feat [B, T, n_mel], mask [B, T] bool -> (embeddings [B, S, text hidden], valid [B, S])."""
        t = self.t
        x, valid = self.subsample(feat, mask.astype(np.float64))
        valid = valid.astype(bool)
        pe = self.position_embeddings()
        mask5 = self.blocked_mask(valid)
        for i in range(self.layers):
            x = self.layer(x, pe, mask5, self.ap + "layers.%d" % i)
        x = x @ t[self.ap + "output_proj.weight"].T + t[self.ap + "output_proj.bias"]
        x = rms_norm(x, None, self.eps)
        return x @ t[self.ep + "embedding_projection.weight"].T, valid


def encode(argv):
    from siglip_ref import read_checkpoint
    model_dir, feat_path, mask_path, frames_arg, out_path = argv
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tower = AudioTower(cfg, read_checkpoint(model_dir), read_dtypes(model_dir))
    frames = [int(n) for n in frames_arg.split(",")]
    mask = np.fromfile(mask_path, dtype=np.uint8).astype(bool)
    feat = np.fromfile(feat_path, dtype="<f4").astype(np.float64).reshape(len(mask), -1)
    B, T = len(frames), max(frames)
    fb = np.zeros((B, T, feat.shape[1]))
    mb = np.zeros((B, T), bool)
    at = 0
    for b, n in enumerate(frames):
        fb[b, :n], mb[b, :n] = feat[at:at + n], mask[at:at + n]
        at += n
    emb, valid = tower(fb, mb)
    out = emb[valid]  # clip after clip, each clip's valid tokens in time order
    out.astype("<f4").tofile(out_path)
    print(",".join(str(int(v.sum())) for v in valid))


def main():
    if len(sys.argv) == 7 and sys.argv[1] == "encode":
        encode(sys.argv[2:])
        return
    if len(sys.argv) != 5 or sys.argv[1] != "features":
        sys.exit(__doc__)
    with open(sys.argv[2]) as f:
        cfg = json.load(f)
    pcm = np.fromfile(sys.argv[3], dtype="<f4")
    feat, mask = Extractor(cfg)(pcm)
    with open(sys.argv[4], "wb") as f:
        f.write(np.ascontiguousarray(feat, "<f8").tobytes())
        f.write(mask.astype(np.uint8).tobytes())
    print(feat.shape[0], soft_tokens(mask))


if __name__ == "__main__":
    main()
