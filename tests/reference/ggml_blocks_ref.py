#!/usr/bin/env python3
"""ggml's block formats, written from their definitions with numpy.

    ggml_blocks_ref.py deq   TYPE IN OUT   blocks of TYPE (raw bytes) -> float32 values
    ggml_blocks_ref.py quant TYPE IN OUT   float32 values -> blocks of TYPE
    ggml_blocks_ref.py ggml  TYPE IN OUT LIB   the same by ggml's own quantize_row_*_ref
                                           in LIB (a libggml-base.so): the outside check
    ggml_blocks_ref.py ggmldeq TYPE IN OUT LIB deq by ggml's own dequantize_row_* in LIB

TYPE: q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k, and for deq also q3_k, iq4_nl,
iq4_xs and q2_k (read from llama.cpp's files, not written here). The arithmetic is float32 in
ggml's reference order (a scale times an integer, then the offset), so the
values are bit-exact; quantization rounds as ggml's reference quantizers do
(roundf: half away from zero; float -> int casts truncate; the K-quants'
nearest_int: half to even through the float adder). The K-quants' searches
run on every sub-block of the input at once: one numpy lane per sub-block,
each running sum kept in float32 and added in element order.
"""
import sys

import numpy as np

F32 = np.float32
BLOCK = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22),
         "q5_1": (32, 24), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
         "q3_k": (256, 110), "iq4_nl": (32, 18), "iq4_xs": (256, 136), "q2_k": (256, 84)}
# IQ4_NL's and IQ4_XS's 16 levels, a nibble's value (ggml-common.h's kvalues_iq4nl)
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.int64)


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


def unpack_levels(b, at, five):
    """The 32 levels [n, 32] of Q4_0 / Q4_1 blocks b, or Q5_0 / Q5_1 ones,
    whose quants start at byte at: what pack_levels writes."""
    if five:
        qh = b[:, at : at + 4].copy().view("<u4").astype(np.int64).reshape(-1)
        q = b[:, at + 4 :].astype(np.int64)
        j = np.arange(16)
        x0 = (q & 0xF) | (((qh[:, None] >> j) << 4) & 0x10)
        x1 = (q >> 4) | ((qh[:, None] >> (j + 12)) & 0x10)
    else:
        q = b[:, at:].astype(np.int64)
        x0, x1 = q & 0xF, q >> 4
    return np.concatenate([x0, x1], axis=1)


def deq(t, raw):
    be, bb = BLOCK[t]
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, bb)
    n = b.shape[0]
    y = np.zeros((n, be), dtype=F32)
    if t == "q8_0":
        d = f16(b, 0)
        y[:] = b[:, 2:].view(np.int8).astype(F32) * d[:, None]
    elif t in ("q4_0", "q4_1", "q5_0", "q5_1"):
        one, five = t.endswith("_1"), t.startswith("q5")
        d = f16(b, 0)
        x = unpack_levels(b, 4 if one else 2, five)
        if one:
            y[:] = x.astype(F32) * d[:, None] + f16(b, 2)[:, None]
        else:
            y[:] = (x - (16 if five else 8)).astype(F32) * d[:, None]
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
    elif t == "q3_k":
        # hmask[32], qs[64] (2 bits each), 12 bytes of sixteen 6-bit scales, d: sub-block
        # j of 16 is d * (scale_j - 32) * (its 2 bits - 4 where its hmask bit is clear)
        hm, q = b[:, :32].astype(np.int64), b[:, 32:96].astype(np.int64)
        sb = b[:, 96:108].astype(np.int64)
        d = f16(b, 108)
        sc = np.zeros((n, 16), dtype=np.int64)
        for j in range(4):
            hi = sb[:, 8 + j]
            sc[:, j] = (sb[:, j] & 0xF) | ((hi & 3) << 4)
            sc[:, 4 + j] = (sb[:, 4 + j] & 0xF) | (((hi >> 2) & 3) << 4)
            sc[:, 8 + j] = (sb[:, j] >> 4) | (((hi >> 4) & 3) << 4)
            sc[:, 12 + j] = (sb[:, 4 + j] >> 4) | (((hi >> 6) & 3) << 4)
        for c in range(8):  # 32 elements: half c // 4, shift 2 (c % 4), hmask bit c
            h, s = c // 4, 2 * (c % 4)
            lv = ((q[:, 32 * h:32 * h + 32] >> s) & 3) - np.where(hm & (1 << c), 0, 4)
            for k in range(2):
                dl = d * (sc[:, 2 * c + k] - 32).astype(F32)
                y[:, 32 * c + 16 * k:32 * c + 16 * k + 16] = \
                    dl[:, None] * lv[:, 16 * k:16 * k + 16].astype(F32)
    elif t == "q2_k":
        # scales[16] (4-bit scale | 4-bit min << 4), qs[64] as q3_k's, d, dmin: sub-block
        # j of 16 is (d * scale_j) * its 2 bits - dmin * min_j
        sc, q = b[:, :16].astype(np.int64), b[:, 16:80].astype(np.int64)
        d, dmin = f16(b, 80), f16(b, 82)
        for c in range(8):
            h, s = c // 4, 2 * (c % 4)
            lv = (q[:, 32 * h:32 * h + 32] >> s) & 3
            for k in range(2):
                j = 2 * c + k
                dl = d * (sc[:, j] & 0xF).astype(F32)
                ml = dmin * (sc[:, j] >> 4).astype(F32)
                y[:, 32 * c + 16 * k:32 * c + 16 * k + 16] = \
                    dl[:, None] * lv[:, 16 * k:16 * k + 16].astype(F32) - ml[:, None]
    elif t == "iq4_nl":
        d = f16(b, 0)
        q = b[:, 2:].astype(np.int64)
        x = IQ4_LEVELS[np.concatenate([q & 0xF, q >> 4], axis=1)]
        y[:] = d[:, None] * x.astype(F32)
    elif t == "iq4_xs":
        # d, scales_h (u16: 2 high bits of each of 8 scales), scales_l[4] (their low
        # nibbles), qs[128]: sub-block j of 32 is d * (scale_j - 32) * the levels
        d = f16(b, 0)
        sh = b[:, 2:4].copy().view("<u2").astype(np.int64).reshape(-1)
        sl = b[:, 4:8].astype(np.int64)
        q = b[:, 8:].astype(np.int64)
        for j in range(8):
            ls = ((sl[:, j // 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4)
            dl = d * (ls - 32).astype(F32)
            qj = q[:, 16 * j:16 * j + 16]
            x = IQ4_LEVELS[np.concatenate([qj & 0xF, qj >> 4], axis=1)]
            y[:, 32 * j:32 * j + 32] = dl[:, None] * x.astype(F32)
    return y.reshape(-1)


def roundf(v):
    """C's roundf: half away from zero (in float64: exact for float32 inputs)."""
    a = np.floor(np.abs(v.astype(np.float64)) + 0.5)
    return np.where(v < 0, -a, a)


def trunc(v):
    return np.trunc(v.astype(np.float64)).astype(np.int64)


def f16_bytes(v):
    return np.array(v, dtype=F32).astype(np.float16).view(np.uint8).reshape(-1, 2)


def nearest_int(v):
    """ggml's nearest_int: v + 1.5 * 2^23 in float32, its low 23 bits less 2^22."""
    s = (np.asarray(v, dtype=F32) + F32(12582912.0)).astype(F32)
    return (s.view(np.int32).astype(np.int64) & 0x7FFFFF) - 0x400000


def fit_scale_min(x, w, nmax, rmin, rdelta, nstep):
    """Per row of x [G, n] (weights w): levels [G, n] in 0..nmax, scale [G] and
    -min [G]; a least-squares (scale, min) search over level counts
    nmax + rmin + rdelta * k, k = 0..nstep, kept where the weighted squared
    error drops below the plain min..max grid's."""
    G, n = x.shape
    lo, hi = x[:, 0].copy(), x[:, 0].copy()
    sw, sx = w[:, 0].copy(), (w[:, 0] * x[:, 0]).astype(F32)
    for i in range(1, n):
        lo = np.minimum(lo, x[:, i])
        hi = np.maximum(hi, x[:, i])
        sw = (sw + w[:, i]).astype(F32)
        sx = (sx + (w[:, i] * x[:, i]).astype(F32)).astype(F32)
    lo = np.where(lo > 0, F32(0), lo).astype(F32)
    flat = hi == lo
    span = np.where(flat, F32(1), (hi - lo).astype(F32)).astype(F32)
    iscale = (F32(nmax) / span).astype(F32)
    scale = (F32(1) / iscale).astype(F32)
    L = np.clip(nearest_int((iscale[:, None] * (x - lo[:, None]).astype(F32)).astype(F32)), 0, nmax)
    best = np.zeros(G, dtype=F32)
    for i in range(n):
        diff = ((scale * L[:, i].astype(F32)).astype(F32) + lo).astype(F32) - x[:, i]
        diff = diff.astype(F32)
        best = (best + (w[:, i] * (diff * diff).astype(F32)).astype(F32)).astype(F32)
    for k in range(nstep + 1):
        num = ((F32(rmin) + (F32(rdelta) * F32(k)).astype(F32)).astype(F32) + F32(nmax)).astype(F32)
        span = np.where(flat, F32(1), (hi - lo).astype(F32)).astype(F32)  # lo moves with the fit
        isc = (num / span).astype(F32)
        A = np.clip(nearest_int((isc[:, None] * (x - lo[:, None]).astype(F32)).astype(F32)), 0, nmax)
        Af = A.astype(F32)
        sl = np.zeros(G, dtype=F32)
        sl2 = np.zeros(G, dtype=F32)
        sxl = np.zeros(G, dtype=F32)
        for i in range(n):
            wl = (w[:, i] * Af[:, i]).astype(F32)
            sl = (sl + wl).astype(F32)
            sl2 = (sl2 + (wl * Af[:, i]).astype(F32)).astype(F32)
            sxl = (sxl + (wl * x[:, i]).astype(F32)).astype(F32)
        D = ((sw * sl2).astype(F32) - (sl * sl).astype(F32)).astype(F32)
        ok = D > 0
        Dd = np.where(ok, D, F32(1)).astype(F32)
        s = (((sw * sxl).astype(F32) - (sx * sl).astype(F32)).astype(F32) / Dd).astype(F32)
        m = (((sl2 * sx).astype(F32) - (sl * sxl).astype(F32)).astype(F32) / Dd).astype(F32)
        pos = m > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(pos, (sxl / sl2).astype(F32), s).astype(F32)
        m = np.where(pos, F32(0), m).astype(F32)
        err = np.zeros(G, dtype=F32)
        for i in range(n):
            diff = (((s * Af[:, i]).astype(F32) + m).astype(F32) - x[:, i]).astype(F32)
            err = (err + (w[:, i] * (diff * diff).astype(F32)).astype(F32)).astype(F32)
        take = ok & (err < best) & ~flat
        L = np.where(take[:, None], A, L)
        best = np.where(take, err, best).astype(F32)
        scale = np.where(take, s, scale).astype(F32)
        lo = np.where(take, m, lo).astype(F32)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, F32(0), scale).astype(F32)
    return L, scale, (-lo).astype(F32)


def quant_q45_k(x, five):
    nmax = 31 if five else 15
    nb = x.shape[0]
    xs = x.reshape(nb * 8, 32)
    s2 = np.zeros(nb * 8, dtype=F32)
    for i in range(32):
        s2 = (s2 + (xs[:, i] * xs[:, i]).astype(F32)).astype(F32)
    av = np.sqrt((s2 / F32(32)).astype(F32)).astype(F32)
    w = (av[:, None] + np.abs(xs)).astype(F32)
    L, sc, mn = fit_scale_min(xs, w, nmax, -0.5 if five else -1.0, 0.1, 15 if five else 20)
    L, sc, mn = L.reshape(nb, 256), sc.reshape(nb, 8), mn.reshape(nb, 8)
    max_sc = np.maximum(sc.max(axis=1), F32(0)).astype(F32)
    max_mn = np.maximum(mn.max(axis=1), F32(0)).astype(F32)
    inv_sc = np.where(max_sc > 0, F32(63) / np.where(max_sc > 0, max_sc, F32(1)), F32(0)).astype(F32)
    inv_mn = np.where(max_mn > 0, F32(63) / np.where(max_mn > 0, max_mn, F32(1)), F32(0)).astype(F32)
    ls = np.minimum(nearest_int((inv_sc[:, None] * sc).astype(F32)) & 0xFF, 63)
    lm = np.minimum(nearest_int((inv_mn[:, None] * mn).astype(F32)) & 0xFF, 63)
    scales = np.zeros((nb, 12), dtype=np.int64)
    scales[:, 0:4] = ls[:, 0:4]
    scales[:, 4:8] = lm[:, 0:4]
    scales[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    scales[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    scales[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    db = f16_bytes((max_sc / F32(63)).astype(F32))
    mb = f16_bytes((max_mn / F32(63)).astype(F32))
    d = db.copy().view(np.float16).astype(F32).reshape(-1)
    dmin = mb.copy().view(np.float16).astype(F32).reshape(-1)
    s6, m6 = scale_min_k4(scales.astype(np.uint8))
    dj = (d[:, None] * s6.astype(F32)).astype(F32)
    dm = (dmin[:, None] * m6.astype(F32)).astype(F32)
    xb = x.reshape(nb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (((xb + dm[:, :, None]).astype(F32)) / dj[:, :, None]).astype(F32)
    q = np.where(dj[:, :, None] != 0, q, F32(0))
    R = np.clip(nearest_int(q), 0, nmax).reshape(nb, 256)
    R = np.where(np.repeat(dj != 0, 32, axis=1), R, L)
    bb = 176 if five else 144
    out = np.zeros((nb, bb), dtype=np.uint8)
    out[:, 0:2], out[:, 2:4], out[:, 4:16] = db, mb, scales.astype(np.uint8)
    qh = np.zeros((nb, 32), dtype=np.int64)
    qs = np.zeros((nb, 128), dtype=np.int64)
    for g in range(4):
        l1, l2 = R[:, 64 * g:64 * g + 32], R[:, 64 * g + 32:64 * g + 64]
        if five:
            qh |= ((l1 >> 4) << (2 * g)) | ((l2 >> 4) << (2 * g + 1))
        qs[:, 32 * g:32 * g + 32] = (l1 & 0xF) | ((l2 & 0xF) << 4)
    if five:
        out[:, 16:48] = qh.astype(np.uint8)
        out[:, 48:] = qs.astype(np.uint8)
    else:
        out[:, 16:] = qs.astype(np.uint8)
    return out


def fit_scale_sym(x, nmax):
    """Per row of x [G, n]: levels [G, n] in 0..2*nmax-1 (value l - nmax) and a
    signed scale; -nmax at the element of largest magnitude, then 18 nearby
    level counts, weights x^2, kept where sumlx^2 / suml2 grows."""
    G, n = x.shape
    idx = np.abs(x).argmax(axis=1)
    amax = np.abs(x).max(axis=1)
    mx = x[np.arange(G), idx]
    zero = amax < F32(1e-15)
    mxs = np.where(zero, F32(1), mx).astype(F32)
    w = (x * x).astype(F32)

    def levels(isc):
        return np.clip(nearest_int((isc[:, None] * x).astype(F32)), -nmax, nmax - 1)

    def sums(l):
        lf = l.astype(F32)
        slx = np.zeros(G, dtype=F32)
        sl2 = np.zeros(G, dtype=F32)
        for i in range(n):
            slx = (slx + ((w[:, i] * x[:, i]).astype(F32) * lf[:, i]).astype(F32)).astype(F32)
            sl2 = (sl2 + ((w[:, i] * lf[:, i]).astype(F32) * lf[:, i]).astype(F32)).astype(F32)
        return slx, sl2

    iscale = (F32(-nmax) / mxs).astype(F32)
    l = levels(iscale)
    L = l + nmax
    slx, sl2 = sums(l)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sl2 != 0, (slx / sl2).astype(F32), F32(0)).astype(F32)
    best = (scale * slx).astype(F32)
    for k in range(-9, 10):
        if k == 0:
            continue
        num = (F32(nmax) + (F32(0.1) * F32(k)).astype(F32)).astype(F32)
        isc = ((-num) / mxs).astype(F32)
        l = levels(isc)
        slx, sl2 = sums(l)
        take = (sl2 > 0) & ((slx * slx).astype(F32) > (best * sl2).astype(F32))
        with np.errstate(divide="ignore", invalid="ignore"):
            s = (slx / sl2).astype(F32)
        L = np.where(take[:, None], l + nmax, L)
        scale = np.where(take, s, scale).astype(F32)
        best = np.where(take, (s * slx).astype(F32), best).astype(F32)
    L = np.where(zero[:, None], 0, L)
    scale = np.where(zero, F32(0), scale).astype(F32)
    return L, scale


def quant_q6_k(x):
    nb = x.shape[0]
    L, sc = fit_scale_sym(x.reshape(nb * 16, 16), 32)
    L, sc = L.reshape(nb, 256), sc.reshape(nb, 16)
    a = np.abs(sc)
    idx = a.argmax(axis=1)
    max_abs = a.max(axis=1)
    max_sc = sc[np.arange(nb), idx]
    zero = max_abs < F32(1e-15)
    iscale = (F32(-128) / np.where(zero, F32(1), max_sc)).astype(F32)
    db = f16_bytes((F32(1) / iscale).astype(F32))
    d = db.copy().view(np.float16).astype(F32).reshape(-1)
    s8 = np.minimum(127, nearest_int((iscale[:, None] * sc).astype(F32))).astype(np.int8)
    dj = (d[:, None] * s8.astype(F32)).astype(F32)
    xb = x.reshape(nb, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (xb / dj[:, :, None]).astype(F32)
    q = np.where(dj[:, :, None] != 0, q, F32(0))
    R = (np.clip(nearest_int(q), -32, 31) + 32).reshape(nb, 256)
    R = np.where(np.repeat(dj != 0, 16, axis=1), R, L)
    out = np.zeros((nb, 210), dtype=np.uint8)
    for half in range(2):
        Q = R[:, 128 * half:128 * half + 128]
        q1, q2, q3, q4 = Q[:, 0:32], Q[:, 32:64], Q[:, 64:96], Q[:, 96:128]
        out[:, 64 * half:64 * half + 32] = ((q1 & 0xF) | ((q3 & 0xF) << 4)).astype(np.uint8)
        out[:, 64 * half + 32:64 * half + 64] = ((q2 & 0xF) | ((q4 & 0xF) << 4)).astype(np.uint8)
        out[:, 128 + 32 * half:160 + 32 * half] = (
            (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)).astype(np.uint8)
    out[:, 192:208] = s8.view(np.uint8)
    out[:, 208:210] = db
    out[zero] = 0
    return out


def inverse(d):
    """1 / d in float32, 0 where d is 0."""
    return np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)


def pack_levels(out, at, v, five):
    """The 32 levels v [n, 32] of Q4_0 / Q4_1 blocks (4 bits each) or Q5_0 /
    Q5_1 ones (5 bits: the fifth bits first, as a little-endian uint32) into
    out[:, at:]: value j's low nibble and value j + 16's high one in byte j."""
    lo, hi = v[:, :16], v[:, 16:]
    q = ((lo & 0xF) | ((hi & 0xF) << 4)).astype(np.uint8)
    if five:
        j = np.arange(16)
        qh = (((lo & 0x10) >> 4) << j).sum(axis=1) + (((hi & 0x10) >> 4) << (j + 16)).sum(axis=1)
        out[:, at : at + 4] = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
        at += 4
    out[:, at:] = q


def quant(t, x):
    be, bb = BLOCK[t]
    x = x.reshape(-1, be)
    n = x.shape[0]
    out = np.zeros((n, bb), dtype=np.uint8)
    if t == "q8_0":
        amax = np.abs(x).max(axis=1)
        d = (amax / F32(127)).astype(F32)
        idv = inverse(d)
        out[:, 0:2] = f16_bytes(d)
        out[:, 2:] = roundf((x * idv[:, None]).astype(F32)).astype(np.int8).view(np.uint8)
        return out
    if t in ("q4_0", "q5_0"):
        five = t == "q5_0"
        idx = np.abs(x).argmax(axis=1)
        mx = x[np.arange(n), idx]
        mx = np.where(np.abs(x).max(axis=1) > 0, mx, F32(0)).astype(F32)
        d = (mx / F32(-16 if five else -8)).astype(F32)
        idv = inverse(d)
        add = F32(16.5 if five else 8.5)
        v = trunc(((x * idv[:, None]).astype(F32) + add).astype(F32))
        v = np.minimum(31 if five else 15, v)
        out[:, 0:2] = f16_bytes(d)
        pack_levels(out, 2, v, five)
        return out
    if t in ("q4_1", "q5_1"):
        five = t == "q5_1"
        lo_v, hi_v = x.min(axis=1), x.max(axis=1)
        d = ((hi_v - lo_v) / F32(31 if five else 15)).astype(F32)
        idv = inverse(d)
        v = trunc((((x - lo_v[:, None]).astype(F32) * idv[:, None]).astype(F32) + F32(0.5)).astype(F32))
        if not five:
            v = np.minimum(15, v)
        out[:, 0:2] = f16_bytes(d)
        out[:, 2:4] = f16_bytes(lo_v)
        pack_levels(out, 4, v, five)
        return out
    if t in ("q4_k", "q5_k"):
        return quant_q45_k(x, t == "q5_k")
    if t == "q6_k":
        return quant_q6_k(x)
    sys.exit("no quantizer for " + t)


def ggml_row_fn(lib, fmt, t, src, out, k):
    """Calls ggml's row function fmt % TYPE t's ggml name (q4_K for q4_k) in the
    shared library lib on the arrays src and out, k elements; returns out."""
    import ctypes
    f = getattr(ctypes.CDLL(lib), fmt % (t[:3] + "K" if t.endswith("_k") else t))
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    f.restype = None
    f(src.ctypes.data, out.ctypes.data, k)
    return out


def ggml_quant(t, x, lib):
    """Blocks of TYPE t by ggml's quantize_row_<t>_ref in the shared library lib."""
    be, bb = BLOCK[t]
    x = np.ascontiguousarray(x, dtype=F32)
    return ggml_row_fn(lib, "quantize_row_%s_ref", t, x,
                       np.zeros(len(x) // be * bb, dtype=np.uint8), len(x))


def ggml_deq(t, raw, lib):
    """Values of the blocks raw of TYPE t by ggml's dequantize_row_<t> in lib."""
    be, bb = BLOCK[t]
    b = np.frombuffer(raw, dtype=np.uint8).copy()
    n = len(b) // bb * be
    return ggml_row_fn(lib, "dequantize_row_%s", t, b, np.zeros(n, dtype=F32), n)


def main():
    mode, t, src, dst = sys.argv[1:5]
    raw = open(src, "rb").read()
    if mode == "ggmldeq":
        open(dst, "wb").write(ggml_deq(t, raw, sys.argv[5]).tobytes())
    elif mode == "ggml":
        open(dst, "wb").write(ggml_quant(t, np.frombuffer(raw, dtype=F32), sys.argv[5]).tobytes())
    elif mode == "deq":
        open(dst, "wb").write(deq(t, raw).astype(F32).tobytes())
    else:
        open(dst, "wb").write(quant(t, np.frombuffer(raw, dtype=F32)).tobytes())


if __name__ == "__main__":
    main()
