"""Calibrate the timing model against published Trainium measurements.

    python tools/calibrate.py              # the four NKI matmul tutorial schedules + the DMA figure
    python tools/calibrate.py --small      # a quick, scaled-down run (what the tests time)

The NKI matmul tutorial (SDK 2.25, `general/nki/tutorials/matrix_multiplication.rst`) publishes
the latency of four schedules of one BF16 [4096, 8192] @ [8192, 8192] GEMM on one trn1
NeuronCore: tiled 51.80 ms, hoisted loads 42.96 ms, blocked M/N 22.07 ms, blocked M/N/K 6.97 ms
(HFU 85.24%). Each schedule is written here with the KernelBuilder as the tutorial writes it
(same loops, tile shapes, block sizes and loads), and timed in timing-only mode: no numerics.
`lhsT` is the [K, M] left operand, delivered transposed as in the tutorial.
"""

from __future__ import annotations

import argparse
import sys
import time

from neuroncc.codegen import costs
from neuroncc.codegen.kernel_builder import HbmTensor, KernelBuilder
from neuroncc.codegen.targets import get_target
from neuroncc.ir.types import DType
from neuroncc.runtime.timing import time_executable

BF16 = DType.BF16
TILE_M, TILE_K, TILE_N = 128, 128, 512

# Published latencies in ms, trn1, M=4096, K=8192, N=8192.
PUBLISHED_MS = {"tiled": 51.80, "hoisted": 42.96, "blocked_mn": 22.07, "blocked_mnk": 6.97}
PUBLISHED_DMA_NS = 1416.0  # 32 KiB on one trn2 DMA engine (nki-dma-overview)


def _operands(kb: KernelBuilder, m: int, k: int, n: int):
    return (
        kb.hbm("lhsT", (k, m), BF16),
        kb.hbm("rhs", (k, n), BF16),
        kb.hbm("result", (m, n), BF16, kind="output"),
    )


def _tile(t: HbmTensor, r: int, rows: int, c: int, cols: int):
    return t[r * rows : (r + 1) * rows, c * cols : (c + 1) * cols]


def tiled(kb: KernelBuilder, m: int, k: int, n: int) -> None:
    """nki_matmul_tiled_: both operand tiles loaded for every matmul."""
    lhsT, rhs, result = _operands(kb, m, k, n)
    lhs_pool = kb.sbuf_pool((TILE_K, TILE_M), BF16, bufs=4)
    rhs_pool = kb.sbuf_pool((TILE_K, TILE_N), BF16, bufs=4)
    res_pool = kb.sbuf_pool((TILE_M, TILE_N), BF16, bufs=2)
    acc = kb.psum_pool(bufs=2)
    for mi in range(m // TILE_M):
        for ni in range(n // TILE_N):
            psum = acc.tile()
            for ki in range(k // TILE_K):
                lt, rt = lhs_pool.tile(), rhs_pool.tile()
                kb.load(lt, _tile(lhsT, ki, TILE_K, mi, TILE_M))
                kb.load(rt, _tile(rhs, ki, TILE_K, ni, TILE_N))
                kb.matmul(psum, lt, rt, accumulate=ki > 0)
            res = res_pool.tile()
            kb.copy(res, psum)
            kb.store(_tile(result, mi, TILE_M, ni, TILE_N), res)


def hoisted(kb: KernelBuilder, m: int, k: int, n: int) -> None:
    """nki_matmul_hoist_load_: a column of lhsT tiles loaded once per m, of rhs once per n."""
    lhsT, rhs, result = _operands(kb, m, k, n)
    kt = k // TILE_K
    lhs_pool = kb.sbuf_pool((TILE_K, TILE_M), BF16, bufs=2 * kt)
    rhs_pool = kb.sbuf_pool((TILE_K, TILE_N), BF16, bufs=kt)
    res_pool = kb.sbuf_pool((TILE_M, TILE_N), BF16, bufs=2)
    acc = kb.psum_pool(bufs=2)
    for mi in range(m // TILE_M):
        lts = [lhs_pool.tile() for _ in range(kt)]
        for ki, lt in enumerate(lts):
            kb.load(lt, _tile(lhsT, ki, TILE_K, mi, TILE_M))
        for ni in range(n // TILE_N):
            rts = [rhs_pool.tile() for _ in range(kt)]
            for ki, rt in enumerate(rts):
                kb.load(rt, _tile(rhs, ki, TILE_K, ni, TILE_N))
            psum = acc.tile()
            for ki in range(kt):
                kb.matmul(psum, lts[ki], rts[ki], accumulate=ki > 0)
            res = res_pool.tile()
            kb.copy(res, psum)
            kb.store(_tile(result, mi, TILE_M, ni, TILE_N), res)


def blocked_mn(kb: KernelBuilder, m: int, k: int, n: int, bm: int = 2, bn: int = 2) -> None:
    """nki_matmul_block_free_dimension_: lhsT tiles for bm M-tiles and rhs tiles for bn N-tiles
    are loaded once and reused by the bm x bn result tiles."""
    lhsT, rhs, result = _operands(kb, m, k, n)
    kt = k // TILE_K
    lhs_pool = kb.sbuf_pool((TILE_K, TILE_M), BF16, bufs=bm * kt)
    rhs_pool = kb.sbuf_pool((TILE_K, TILE_N), BF16, bufs=bn * kt)
    res_pool = kb.sbuf_pool((TILE_M, TILE_N), BF16, bufs=2)
    acc = kb.psum_pool(bufs=2)
    for mb in range(m // (TILE_M * bm)):
        lts = [[lhs_pool.tile() for _ in range(kt)] for _ in range(bm)]
        for i in range(bm):
            for ki in range(kt):
                kb.load(lts[i][ki], _tile(lhsT, ki, TILE_K, mb * bm + i, TILE_M))
        for nb in range(n // (TILE_N * bn)):
            rts = [[rhs_pool.tile() for _ in range(kt)] for _ in range(bn)]
            for j in range(bn):
                for ki in range(kt):
                    kb.load(rts[j][ki], _tile(rhs, ki, TILE_K, nb * bn + j, TILE_N))
            for i in range(bm):
                for j in range(bn):
                    psum = acc.tile()
                    for ki in range(kt):
                        kb.matmul(psum, lts[i][ki], rts[j][ki], accumulate=ki > 0)
                    res = res_pool.tile()
                    kb.copy(res, psum)
                    kb.store(_tile(result, mb * bm + i, TILE_M, nb * bn + j, TILE_N), res)


def blocked_mnk(
    kb: KernelBuilder, m: int, k: int, n: int, bm: int = 16, bn: int = 2, bk: int = 8
) -> None:
    """nki_matmul_fully_optimized_: blocks of all three dimensions; partial products are
    accumulated into SBUF result tiles, which are packed and stored once per N block."""
    lhsT, rhs, result = _operands(kb, m, k, n)
    block_m, block_n, block_k = TILE_M * bm, TILE_N * bn, TILE_K * bk
    nbm = m // block_m
    rhs_pool = kb.sbuf_pool((TILE_K, block_n), BF16, bufs=2 * bk)
    lhs_pool = kb.sbuf_pool((TILE_K, block_m), BF16, bufs=2 * bk)
    out_pool = kb.sbuf_pool((TILE_M, TILE_N), BF16, bufs=nbm * bm * bn)
    pack_pool = kb.sbuf_pool((TILE_M, block_n), BF16, bufs=2)
    acc = kb.psum_pool(bufs=2)
    for ni in range(n // block_n):
        out = [[[out_pool.tile() for _ in range(bn)] for _ in range(bm)] for _ in range(nbm)]
        for tiles in out:
            for row in tiles:
                for t in row:
                    kb.memset(t, 0.0)
        for ki in range(k // block_k):
            rts = [rhs_pool.tile() for _ in range(bk)]
            for b, rt in enumerate(rts):
                kb.load(rt, _tile(rhs, ki * bk + b, TILE_K, ni, block_n))
            for mi in range(nbm):
                lts = [lhs_pool.tile() for _ in range(bk)]
                for b, lt in enumerate(lts):
                    kb.load(lt, _tile(lhsT, ki * bk + b, TILE_K, mi, block_m))
                for j in range(bn):
                    for i in range(bm):
                        psum = acc.tile()
                        for b in range(bk):
                            kb.matmul(
                                psum,
                                lts[b].cols(i * TILE_M, TILE_M),
                                rts[b].cols(j * TILE_N, TILE_N),
                                accumulate=b > 0,
                            )
                        kb.tensor_tensor(out[mi][i][j], out[mi][i][j], psum, "add")
        for mi in range(nbm):
            for i in range(bm):
                packed = pack_pool.tile()
                for j in range(bn):
                    kb.copy(packed.cols(j * TILE_N, TILE_N), out[mi][i][j])
                kb.store(_tile(result, mi * bm + i, TILE_M, ni, block_n), packed)


SCHEDULES = {
    "tiled": tiled,
    "hoisted": hoisted,
    "blocked_mn": blocked_mn,
    "blocked_mnk": blocked_mnk,
}


def build(name: str, target: str = "trn1", m: int = 4096, k: int = 8192, n: int = 8192):
    kb = KernelBuilder(target, name)
    SCHEDULES[name](kb, m, k, n)
    return kb.finish()


def dma_32kib_one_engine_ns(target: str = "trn2") -> float:
    """32 KiB as the docs' example moves it: 8 partition rows of 4 KiB on one engine."""
    return costs.dma_ns(32 * 1024, 4096, get_target(target), engines=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="M=512, K=1024, N=1024 instead")
    args = p.parse_args(argv)
    dims = (512, 1024, 1024) if args.small else (4096, 8192, 8192)
    t = get_target("trn1")
    print(f"NKI matmul tutorial, BF16 M={dims[0]} K={dims[1]} N={dims[2]}, one {t.name} core")
    print(f"{'schedule':<14}{'model ms':>10}{'published':>11}{'ratio':>8}{'HFU':>8}{'time s':>8}")
    for name in SCHEDULES:
        t0 = time.perf_counter()
        prof = time_executable(build(name, "trn1", *dims), t)
        secs = time.perf_counter() - t0
        ms = prof.device_ns / 1e6
        pub = PUBLISHED_MS[name] if not args.small else float("nan")
        print(f"{name:<14}{ms:>10.2f}{pub:>11.2f}{ms / pub:>8.2f}{prof.hfu:>8.1%}{secs:>8.1f}")
    dma = dma_32kib_one_engine_ns()
    print(f"32 KiB on one trn2 DMA engine: {dma:.0f} ns (published {PUBLISHED_DMA_NS:.0f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
