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

Usage:
  gemma4_audio_ref.py features CONFIG.json IN.f32 OUT.bin
      IN.f32: raw little-endian float32 samples (16 kHz mono). CONFIG.json: the
      extractor's fields ({} for the defaults). Writes OUT.bin: frames x feature_size
      float64 features, then frames mask bytes; prints "FRAMES TOKENS".
"""
import json
import math
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


def main():
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
