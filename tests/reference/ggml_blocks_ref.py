#!/usr/bin/env python3
"""ggml's block formats, written from their definitions with numpy.

    ggml_blocks_ref.py deq   TYPE IN OUT   blocks of TYPE (raw bytes) -> float32 values
    ggml_blocks_ref.py quant TYPE IN OUT   float32 values -> blocks of TYPE

TYPE: q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k (quant: the first five). The
arithmetic is float32 in ggml's reference order (a scale times an integer,
then the offset), so the values are bit-exact; quantization rounds as ggml's
reference quantizers do (roundf: half away from zero; float -> int casts
truncate).
"""
import sys

import numpy as np

F32 = np.float32
BLOCK = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22),
         "q5_1": (32, 24), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}


def f16(b, off):
    return b[:, off:off + 2].copy().view(np.float16).astype(F32).reshape(-1)


def scale_min_k4(sc):
    """The 8 (scale, min) pairs of each block's 12 scale bytes: [n, 8] each."""
    s = np.zeros((sc.shape[0], 8), dtype=np.int64)
    m = np.zeros_like(s)
    q = sc.astype(np.int64)
    for j in range(8):
        if j < 4:
            s[:, j] = q[:, j] & 63
            m[:, j] = q[:, j + 4] & 63
        else:
            s[:, j] = (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4)
            m[:, j] = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
    return s, m


def deq(t, raw):
    be, bb = BLOCK[t]
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, bb)
    n = b.shape[0]
    y = np.zeros((n, be), dtype=F32)
    if t == "q8_0":
        d = f16(b, 0)
        y[:] = b[:, 2:].view(np.int8).astype(F32) * d[:, None]
    elif t in ("q4_0", "q4_1"):
        one = t == "q4_1"
        d = f16(b, 0)
        q = b[:, 4:] if one else b[:, 2:]
        lo, hi = (q & 0xF).astype(np.int64), (q >> 4).astype(np.int64)
        if one:
            m = f16(b, 2)
            y[:, :16] = lo.astype(F32) * d[:, None] + m[:, None]
            y[:, 16:] = hi.astype(F32) * d[:, None] + m[:, None]
        else:
            y[:, :16] = (lo - 8).astype(F32) * d[:, None]
            y[:, 16:] = (hi - 8).astype(F32) * d[:, None]
    elif t in ("q5_0", "q5_1"):
        one = t == "q5_1"
        d = f16(b, 0)
        qh = b[:, 4:8] if one else b[:, 2:6]
        qh = qh.copy().view("<u4").astype(np.int64).reshape(-1)
        q = (b[:, 8:] if one else b[:, 6:]).astype(np.int64)
        j = np.arange(16)
        x0 = (q & 0xF) | (((qh[:, None] >> j) << 4) & 0x10)
        x1 = (q >> 4) | ((qh[:, None] >> (j + 12)) & 0x10)
        if one:
            m = f16(b, 2)
            y[:, :16] = x0.astype(F32) * d[:, None] + m[:, None]
            y[:, 16:] = x1.astype(F32) * d[:, None] + m[:, None]
        else:
            y[:, :16] = (x0 - 16).astype(F32) * d[:, None]
            y[:, 16:] = (x1 - 16).astype(F32) * d[:, None]
    elif t in ("q4_k", "q5_k"):
        five = t == "q5_k"
        d, dmin = f16(b, 0), f16(b, 2)
        s, m = scale_min_k4(b[:, 4:16])
        qh = b[:, 16:48].astype(np.int64) if five else None
        q = (b[:, 48:] if five else b[:, 16:]).astype(np.int64)
        for g in range(4):
            d1 = d * s[:, 2 * g].astype(F32)
            m1 = dmin * m[:, 2 * g].astype(F32)
            d2 = d * s[:, 2 * g + 1].astype(F32)
            m2 = dmin * m[:, 2 * g + 1].astype(F32)
            ql = q[:, 32 * g:32 * g + 32]
            v1, v2 = ql & 0xF, ql >> 4
            if five:
                v1 = v1 + np.where(qh & (1 << (2 * g)), 16, 0)
                v2 = v2 + np.where(qh & (2 << (2 * g)), 16, 0)
            y[:, 64 * g:64 * g + 32] = d1[:, None] * v1.astype(F32) - m1[:, None]
            y[:, 64 * g + 32:64 * g + 64] = d2[:, None] * v2.astype(F32) - m2[:, None]
    elif t == "q6_k":
        ql, qh = b[:, :128].astype(np.int64), b[:, 128:192].astype(np.int64)
        sc = b[:, 192:208].view(np.int8).astype(F32)
        d = f16(b, 208)
        for half in range(2):
            L, H, S = ql[:, 64 * half:], qh[:, 32 * half:], sc[:, 8 * half:]
            for l in range(32):
                i = l // 16
                q1 = ((L[:, l] & 0xF) | ((H[:, l] >> 0) & 3) << 4) - 32
                q2 = ((L[:, l + 32] & 0xF) | ((H[:, l] >> 2) & 3) << 4) - 32
                q3 = ((L[:, l] >> 4) | ((H[:, l] >> 4) & 3) << 4) - 32
                q4 = ((L[:, l + 32] >> 4) | ((H[:, l] >> 6) & 3) << 4) - 32
                o = 128 * half
                y[:, o + l] = d * S[:, i] * q1.astype(F32)
                y[:, o + l + 32] = d * S[:, i + 2] * q2.astype(F32)
                y[:, o + l + 64] = d * S[:, i + 4] * q3.astype(F32)
                y[:, o + l + 96] = d * S[:, i + 6] * q4.astype(F32)
    return y.reshape(-1)


def roundf(v):
    """C's roundf: half away from zero (in float64: exact for float32 inputs)."""
    a = np.floor(np.abs(v.astype(np.float64)) + 0.5)
    return np.where(v < 0, -a, a)


def trunc(v):
    return np.trunc(v.astype(np.float64)).astype(np.int64)


def f16_bytes(v):
    return np.array(v, dtype=F32).astype(np.float16).view(np.uint8).reshape(-1, 2)


def quant(t, x):
    be, bb = BLOCK[t]
    x = x.reshape(-1, be)
    n = x.shape[0]
    out = np.zeros((n, bb), dtype=np.uint8)
    if t == "q8_0":
        amax = np.abs(x).max(axis=1)
        d = (amax / F32(127)).astype(F32)
        idv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)
        out[:, 0:2] = f16_bytes(d)
        out[:, 2:] = roundf((x * idv[:, None]).astype(F32)).astype(np.int8).view(np.uint8)
        return out
    if t in ("q4_0", "q5_0"):
        five = t == "q5_0"
        idx = np.abs(x).argmax(axis=1)
        mx = x[np.arange(n), idx]
        mx = np.where(np.abs(x).max(axis=1) > 0, mx, F32(0)).astype(F32)
        d = (mx / F32(-16 if five else -8)).astype(F32)
        idv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)
        add = F32(16.5 if five else 8.5)
        v = trunc(((x * idv[:, None]).astype(F32) + add).astype(F32))
        v = np.minimum(31 if five else 15, v)
        lo, hi = v[:, :16], v[:, 16:]
        q = ((lo & 0xF) | ((hi & 0xF) << 4)).astype(np.uint8)
        out[:, 0:2] = f16_bytes(d)
        if five:
            j = np.arange(16)
            qh = (((lo & 0x10) >> 4) << j).sum(axis=1) + (((hi & 0x10) >> 4) << (j + 16)).sum(axis=1)
            out[:, 2:6] = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
            out[:, 6:] = q
        else:
            out[:, 2:] = q
        return out
    if t in ("q4_1", "q5_1"):
        five = t == "q5_1"
        lo_v, hi_v = x.min(axis=1), x.max(axis=1)
        d = ((hi_v - lo_v) / F32(31 if five else 15)).astype(F32)
        idv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)
        v = trunc((((x - lo_v[:, None]).astype(F32) * idv[:, None]).astype(F32) + F32(0.5)).astype(F32))
        if not five:
            v = np.minimum(15, v)
        lo, hi = v[:, :16], v[:, 16:]
        q = ((lo & 0xF) | ((hi & 0xF) << 4)).astype(np.uint8)
        out[:, 0:2] = f16_bytes(d)
        out[:, 2:4] = f16_bytes(lo_v)
        if five:
            j = np.arange(16)
            qh = (((lo & 0x10) >> 4) << j).sum(axis=1) + (((hi & 0x10) >> 4) << (j + 16)).sum(axis=1)
            out[:, 4:8] = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
            out[:, 8:] = q
        else:
            out[:, 4:] = q
        return out
    sys.exit("no quantizer for " + t)


def main():
    mode, t, src, dst = sys.argv[1:5]
    raw = open(src, "rb").read()
    if mode == "deq":
        open(dst, "wb").write(deq(t, raw).astype(F32).tobytes())
    else:
        open(dst, "wb").write(quant(t, np.frombuffer(raw, dtype=F32)).tobytes())


if __name__ == "__main__":
    main()
