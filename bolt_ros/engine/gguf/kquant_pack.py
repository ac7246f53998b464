"""numpy quantizers that write llama.cpp's block layouts (for the GGUF writer, writer.py).

gguf-py 0.19 quantizes F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 but not the K-quants that make up a Q4_K_M file, so Q4_K
and Q6_K are packed here, vectorized over all blocks of a tensor. The scale searches follow llama.cpp's reference
quantizers (`ggml-quants.c`: `make_qkx2_quants` for Q4_K, `make_qx_quants` with rmse_type 1 for Q6_K), so the
bytes match `quantize_row_q4_K_ref` / `quantize_row_q6_K_ref` up to float summation order. `search=False` keeps the
first (min/max) guess instead of searching: ~10x faster, slightly less accurate; the writer uses it for random
models where accuracy does not matter and E4B-sized tensors would otherwise take minutes.

Block layouts (QK_K = 256 elements per super-block):
    Q4_K (144 bytes): d f16 | dmin f16 | scales[12] (8 x 6-bit scale, 8 x 6-bit min) | qs[128] (4-bit)
    Q6_K (210 bytes): ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] int8 | d f16
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES

QK_K = 256
GROUP_MAX_EPS = 1e-15


def quantize(data: np.ndarray, qtype: QT | int, *, search: bool = True) -> np.ndarray:
    """Rows of float data -> the tensor's bytes as gguf-py lays them out.

    `data` is [..., n] in PyTorch order (n = the contiguous ggml ne0, a multiple of the type's block). F32/F16 return
    float arrays of the same shape; every quantized type returns uint8 [..., n // block * block_bytes].
    """
    qtype = QT(qtype)
    x = np.ascontiguousarray(data, dtype=np.float32)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if x.shape[-1] % block:
        raise ValueError(f"row length {x.shape[-1]} is not a multiple of the {block}-element {qtype.name} block")
    if qtype == QT.Q4_K:
        packed = _q4_k(x.reshape(-1, 8, 32), search)
    elif qtype == QT.Q6_K:
        packed = _q6_k(x.reshape(-1, 16, 16), search)
    else:
        return gguf_quants.quantize(x, qtype)
    return packed.reshape(*x.shape[:-1], x.shape[-1] // block * block_bytes)


def dequantize(raw: np.ndarray, qtype: QT | int) -> np.ndarray:
    """Bytes -> float32 through gguf-py (the reference reader our output must satisfy)."""
    return gguf_quants.dequantize(raw, QT(qtype))


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _rint(x: np.ndarray) -> np.ndarray:
    # llama.cpp's nearest_int (the 1.5*2^23 trick) rounds half to even, like rint
    return np.rint(x)


# --- Q4_K ---------------------------------------------------------------------------------------------------------
def _make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int, search: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per 32-element group: (scale, min) minimising the weighted error of x ~ scale * L - min, L in [0, nmax].

    x, w: [G, 32]. Mirrors make_qkx2_quants(rmin=-1, rdelta=0.1, nstep=20, use_mad=false). Returns scale [G] and
    the positive min offset [G] (llama.cpp's `the_min`).
    """
    mn = np.minimum(x.min(axis=1), 0.0)  # [G]
    mx = x.max(axis=1)
    flat = mx == mn
    rng = np.where(flat, 1.0, mx - mn).astype(np.float32)
    sum_w = w.sum(axis=1)
    sum_x = (w * x).sum(axis=1)

    iscale = nmax / rng
    scale = (1.0 / iscale).astype(np.float32)
    L = np.clip(_rint(iscale[:, None] * (x - mn[:, None])), 0, nmax)
    best = (w * (scale[:, None] * L + mn[:, None] - x) ** 2).sum(axis=1)
    best_min = mn.copy()
    if search:
        for step in range(21):
            iscale = (np.float32(-1.0 + 0.1 * step) + nmax) / rng
            la = np.clip(_rint(iscale[:, None] * (x - mn[:, None])), 0, nmax)  # [G, 32]
            sum_l = (w * la).sum(axis=1)
            sum_l2 = (w * la * la).sum(axis=1)
            sum_xl = (w * la * x).sum(axis=1)
            D = sum_w * sum_l2 - sum_l * sum_l
            ok = D > 0
            Ds = np.where(ok, D, 1.0)
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
            pos = this_min > 0  # a positive min cannot be stored: refit the scale alone
            this_scale = np.where(pos, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), this_scale)
            this_min = np.where(pos, 0.0, this_min)
            err = (w * (this_scale[:, None] * la + this_min[:, None] - x) ** 2).sum(axis=1)
            better = ok & (err < best)
            best = np.where(better, err, best)
            scale = np.where(better, this_scale, scale)
            best_min = np.where(better, this_min, best_min)
    scale = np.where(flat, 0.0, scale).astype(np.float32)
    return scale, (-best_min).astype(np.float32)


def _q4_k(x: np.ndarray, search: bool) -> np.ndarray:
    """x: [nb, 8, 32] -> [nb, 144] bytes."""
    nb = x.shape[0]
    groups = x.reshape(nb * 8, 32)
    av = np.sqrt((groups * groups).mean(axis=1, keepdims=True))
    w = av + np.abs(groups)  # llama.cpp's weighting without an importance matrix
    scales, mins = (a.reshape(nb, 8) for a in _make_qkx2(groups, w, 15, search))

    max_scale = np.maximum(scales.max(axis=1), 0.0)  # [nb]
    max_min = np.maximum(mins.max(axis=1), 0.0)
    inv_scale = np.where(max_scale > 0, 63.0 / np.where(max_scale > 0, max_scale, 1.0), 0.0)
    inv_min = np.where(max_min > 0, 63.0 / np.where(max_min > 0, max_min, 1.0), 0.0)
    ls = np.clip(_rint(inv_scale[:, None] * scales), 0, 63).astype(np.uint8)  # [nb, 8]
    lm = np.clip(_rint(inv_min[:, None] * mins), 0, 63).astype(np.uint8)
    d = _f16(max_scale / 63.0)
    dmin = _f16(max_min / 63.0)

    # 6-bit scales/mins: entries 0..3 in the low 6 bits of bytes 0..3 / 4..7, entries 4..7 split into a nibble in
    # bytes 8..11 and their top 2 bits in the high bits of bytes 0..7 (get_scale_min_k4 undoes this)
    packed_scales = np.empty((nb, 12), np.uint8)
    packed_scales[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed_scales[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed_scales[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)

    dd = d.astype(np.float32)[:, None] * ls  # [nb, 8] effective scale per group
    dm = dmin.astype(np.float32)[:, None] * lm
    safe = np.where(dd == 0, 1.0, dd)
    L = np.clip(_rint((x + dm[:, :, None]) / safe[:, :, None]), 0, 15)
    L = np.where(dd[:, :, None] == 0, 0, L).astype(np.uint8)  # [nb, 8, 32]

    # qs: each 32-byte run holds group 2k in the low nibbles and group 2k+1 in the high nibbles
    L = L.reshape(nb, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 128)

    out = np.empty((nb, 144), np.uint8)
    out[:, 0:2] = d.reshape(nb, 1).view(np.uint8)
    out[:, 2:4] = dmin.reshape(nb, 1).view(np.uint8)
    out[:, 4:16] = packed_scales
    out[:, 16:144] = qs
    return out


# --- Q6_K ---------------------------------------------------------------------------------------------------------
def _make_qx(x: np.ndarray, nmax: int, search: bool) -> np.ndarray:
    """Per 16-element group: the signed scale for x ~ scale * l, l in [-nmax, nmax-1], weights x^2.

    x: [G, 16]. Mirrors make_qx_quants(rmse_type=1, qw=NULL); only the scale is returned because Q6_K re-quantizes
    every value after the scales themselves are quantized to int8.
    """
    idx = np.abs(x).argmax(axis=1)
    mx = np.take_along_axis(x, idx[:, None], axis=1)[:, 0]  # signed value of largest magnitude
    zero = np.abs(mx) < GROUP_MAX_EPS
    mx_safe = np.where(zero, 1.0, mx).astype(np.float32)
    w = x * x

    def fit(iscale):
        l = np.clip(_rint(iscale[:, None] * x), -nmax, nmax - 1)
        return (w * x * l).sum(axis=1), (w * l * l).sum(axis=1)

    sumlx, suml2 = fit(-nmax / mx_safe)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, 1.0), 0.0)
    if search:
        best = scale * sumlx
        for step in (*range(-9, 0), *range(1, 10)):
            sumlx, suml2 = fit(-(nmax + np.float32(0.1) * step) / mx_safe)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            new_scale = sumlx / np.where(suml2 > 0, suml2, 1.0)
            scale = np.where(better, new_scale, scale)
            best = np.where(better, new_scale * sumlx, best)
    return np.where(zero, 0.0, scale).astype(np.float32)


def _q6_k(x: np.ndarray, search: bool) -> np.ndarray:
    """x: [nb, 16, 16] -> [nb, 210] bytes."""
    nb = x.shape[0]
    scales = _make_qx(x.reshape(nb * 16, 16), 32, search).reshape(nb, 16)
    idx = np.abs(scales).argmax(axis=1)
    max_scale = np.take_along_axis(scales, idx[:, None], axis=1)[:, 0]  # signed, largest magnitude
    empty = np.abs(max_scale) < GROUP_MAX_EPS
    iscale = -128.0 / np.where(empty, 1.0, max_scale)
    d = np.where(empty, 0.0, _f16(1.0 / iscale).astype(np.float32)).astype(np.float16)
    sc = np.minimum(127, _rint(iscale[:, None] * scales))
    sc = np.where(empty[:, None], 0, sc).astype(np.int8)  # [nb, 16]

    dd = d.astype(np.float32)[:, None] * sc  # [nb, 16]
    safe = np.where(dd == 0, 1.0, dd)
    L = np.clip(_rint(x / safe[:, :, None]), -32, 31) + 32
    L = np.where(dd[:, :, None] == 0, 32, L).astype(np.uint8).reshape(nb, 2, 4, 32)  # [nb, half, quarter, 32]

    ql = np.concatenate([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                         (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], axis=2)  # [nb, 2, 64]
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)

    out = np.empty((nb, 210), np.uint8)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.reshape(nb, 1).view(np.uint8)
    return out
