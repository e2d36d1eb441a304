#!/usr/bin/env python3
"""gemma4_image_ref.py — an independent numpy reference for Gemma 4's image
preprocessing.

Written from Hugging Face transformers' models/gemma4/image_processing_pil_gemma4.py
(get_aspect_ratio_preserving_size, convert_image_to_patches, pad_along_first_dim,
Gemma4ImageProcessorPil._preprocess), image_transforms.rescale (float64 product
cast to float32) and Pillow's documented resampling for 8-bit images (BICUBIC:
Keys' cubic with a = -0.5, support 2 stretched by the downscale factor,
coefficients normalised then rounded to 22-bit fixed point, a horizontal pass
then a vertical one, each rounded and clamped to 8 bits). It shares no code with
lmserve's C path: the resize here is a pair of dense weight matrices applied with
float64 matrix products (exact: every partial sum is an integer below 2^53).

    python3 gemma4_image_ref.py sizes CASES OUT
        CASES: lines "w h patch pool max_soft_tokens"; OUT: lines "tw th", or
        "error" where transformers raises.
    python3 gemma4_image_ref.py images MANIFEST
        MANIFEST: lines "in_path w h patch pool max_soft_tokens out_path". in_path
        holds raw 8-bit RGB [h, w, 3]; out_path receives little-endian
        int32 [tw, th, n_patches, max_patches, soft_tokens, patch_dim],
        int32 positions [max_patches, 2], f32 pixel_values [max_patches, patch_dim]
        (the PIL processor), f32 [max_patches, patch_dim] of the same image resized
        in float64 without 8-bit rounding between or inside the passes and rounded
        once at the end (torch's generic antialiased bicubic, which the torchvision
        processor uses), to measure how far the two processors lie apart.
"""
import math
import sys

import numpy as np

SUPPORTED = (70, 140, 280, 560, 1120)
COEF_BITS = 22


def target_size(h, w, patch, pool, max_soft_tokens):
    """(th, tw), or None where transformers raises ValueError."""
    if max_soft_tokens not in SUPPORTED:
        return None
    max_patches = max_soft_tokens * pool ** 2
    target_px = max_patches * patch ** 2
    factor = math.sqrt(target_px / (h * w))
    mult = pool * patch
    th = int(math.floor(factor * h / mult)) * mult
    tw = int(math.floor(factor * w / mult)) * mult
    if th == 0 and tw == 0:
        return None
    longest = (max_patches // pool ** 2) * mult
    if th == 0:
        th, tw = mult, min(int(math.floor(w / h)) * mult, longest)
    elif tw == 0:
        th, tw = min(int(math.floor(h / w)) * mult, longest), mult
    if th * tw > target_px:
        return None
    return th, tw


def keys_cubic(x):
    a = -0.5
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def weights(n_in, n_out):
    """(fixed-point int matrix, float matrix), both [n_in, n_out]: column o holds
    the taps of output pixel o."""
    scale = n_in / n_out
    fscale = max(scale, 1.0)
    support = 2.0 * fscale
    fixed = np.zeros((n_in, n_out), dtype=np.float64)
    flt = np.zeros((n_in, n_out), dtype=np.float64)
    for o in range(n_out):
        center = (o + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        taps = [keys_cubic((i - center + 0.5) * (1.0 / fscale)) for i in range(lo, hi)]
        total = 0.0
        for t in taps:  # summed in order, as Pillow does
            total += t
        for j, t in enumerate(taps):
            wgt = t / total if total != 0.0 else t
            flt[lo + j, o] = wgt
            q = wgt * (1 << COEF_BITS)
            fixed[lo + j, o] = float(int(q - 0.5) if wgt < 0 else int(q + 0.5))
    return fixed, flt


def horizontal(x, m):
    """[h, w, c] x [w, o] -> [h, o, c] (BLAS float64 products)."""
    return np.matmul(x.transpose(0, 2, 1), m).transpose(0, 2, 1)


def vertical(x, m):
    """[h, w, c] x [h, o] -> [o, w, c]."""
    h, w, c = x.shape
    return np.matmul(m.T, x.reshape(h, w * c)).reshape(m.shape[1], w, c)


def round_clip8(acc):
    """Pillow's 8-bit output of a fixed-point accumulator (one half added first)."""
    v = np.floor((acc + (1 << (COEF_BITS - 1))) / (1 << COEF_BITS))
    return np.clip(v, 0, 255)


def resize_pil(img, th, tw):
    """img [h, w, 3] uint8 -> [th, tw, 3] uint8 (Pillow's BICUBIC, 8-bit)."""
    h, w, _ = img.shape
    x = img.astype(np.float64)
    if tw != w:
        fixed, _ = weights(w, tw)
        x = round_clip8(horizontal(x, fixed))
    if th != h:
        fixed, _ = weights(h, th)
        x = round_clip8(vertical(x, fixed))
    return x.astype(np.uint8)


def resize_float(img, th, tw):
    """The same kernel in float64, rounded to 8 bits once at the end."""
    h, w, _ = img.shape
    x = img.astype(np.float64)
    if tw != w:
        _, flt = weights(w, tw)
        x = horizontal(x, flt)
    if th != h:
        _, flt = weights(h, th)
        x = vertical(x, flt)
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def patchify(img_u8, patch, max_patches):
    """Rescaled, channels-first, patched and padded as the processor does."""
    chw = (img_u8.astype(np.float64) * (1 / 255)).astype(np.float32).transpose(2, 0, 1)
    c, hh, ww = chw.shape
    gh, gw = hh // patch, ww // patch
    p = chw.reshape(c, gh, patch, gw, patch).transpose(1, 3, 2, 4, 0).reshape(gh * gw, -1)
    gx, gy = np.meshgrid(np.arange(gw), np.arange(gh), indexing="xy")
    pos = np.stack([gx, gy], axis=-1).reshape(gh * gw, 2)
    pad = max_patches - p.shape[0]
    p = np.pad(p, [(0, pad), (0, 0)], constant_values=0)
    pos = np.pad(pos, [(0, pad), (0, 0)], constant_values=-1)
    return p.astype("<f4"), pos.astype("<i4"), gh * gw


def one_image(in_path, w, h, patch, pool, mst, out_path):
    img = np.fromfile(in_path, dtype=np.uint8).reshape(h, w, 3)
    th, tw = target_size(h, w, patch, pool, mst)
    if (th, tw) == (h, w):
        pil, flt = img, img
    else:
        pil, flt = resize_pil(img, th, tw), resize_float(img, th, tw)
    max_patches = mst * pool ** 2
    px, pos, n = patchify(pil, patch, max_patches)
    px_f, _, _ = patchify(flt, patch, max_patches)
    head = np.array([tw, th, n, max_patches, n // pool ** 2, patch * patch * 3], dtype="<i4")
    with open(out_path, "wb") as f:
        f.write(head.tobytes())
        f.write(pos.tobytes())
        f.write(px.tobytes())
        f.write(px_f.tobytes())


def main(argv):
    if len(argv) == 4 and argv[1] == "sizes":
        out = []
        with open(argv[2]) as f:
            for line in f:
                if not line.strip():
                    continue
                w, h, patch, pool, mst = (int(t) for t in line.split())
                r = target_size(h, w, patch, pool, mst)
                out.append("error" if r is None else "%d %d" % (r[1], r[0]))
        with open(argv[3], "w") as f:
            f.write("\n".join(out) + "\n")
        return 0
    if len(argv) == 3 and argv[1] == "images":
        with open(argv[2]) as f:
            for line in f:
                t = line.split()
                if t:
                    one_image(t[0], *(int(v) for v in t[1:6]), t[6])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
