"""The attention backward kernel's code (Note [attention backward] in attention_backward.py,
which also has its plan)."""

from __future__ import annotations

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.attention_backward import BackwardPlan, Gradient
from neuroncc.codegen.kernels.emit import EmitCtx, P
from neuroncc.codegen.kernels.pe_transpose import PeTransposer
from neuroncc.codegen.kernels.views import View, strided_view
from neuroncc.ir.graph import Value
from neuroncc.ir.types import DType


def emit_attention_backward(ctx: EmitCtx, bp: BackwardPlan) -> None:
    """Note [attention backward]."""
    b, t = ctx.b, ctx.target
    dt, d, n, m = bp.p.type.dtype, bp.d, bp.n, bp.m
    producers, in_kernels = ctx.graph.producers(), ctx.graph.kernel_of()
    views = {  # read in place (fold_backward_views), in their buffers, or through a folded view
        x.id: ctx.views.get(x.id)
        or (View.of(x) if x.id in ctx.loc else strided_view(x, producers, in_kernels)[0])
        for x in (bp.p, bp.d_out, bp.o, bp.v_t, bp.k, bp.q)
    }
    out_bufs = {}  # the gradients', or the concat's (Note [gradients in place])
    for gr in (bp.dq, bp.dk, bp.dv):
        if gr.dst.base.id not in out_bufs:
            out_bufs[gr.dst.base.id] = ctx.alloc(gr.dst.base)

    def load(dst: isa.TileRef, x: Value, bi: int, r0: int, rows: int) -> None:
        """Rows r0.. of matrix bi of x into dst."""
        v: View = views[x.id]
        off = v.batch_offset(bi) + r0 * v.strides[-2]
        pattern = ((v.strides[-2], rows), (v.strides[-1], dst.free_elems))
        b.dma(dst, isa.DramRef(ctx.buf(v.base), off, dt, pattern))

    def store(gr: Gradient, bi: int, r0: int, src: isa.TileRef) -> None:
        """src, rows r0.. of matrix bi of the gradient, where it goes (`Gradient.dst`)."""
        v: View = gr.dst
        off = v.batch_offset(bi) + r0 * v.strides[-2]
        pattern = ((v.strides[-2], src.np), (v.strides[-1], src.free_elems))
        b.dma(isa.DramRef(out_bufs[v.base.id], off, dt, pattern), src)

    pools = {name: b.sbuf_pool(slot, bufs) for name, (slot, bufs) in bp.pools().items()}
    transpose = PeTransposer(ctx, dt, engine="act")
    chunks = bp.dp_chunks(t)
    dp_psum = b.psum_pool(bufs=bp.dp_sets * len(chunks))
    kv_banks = b.psum_pool(bufs=bp.kv_sets * bp.kv_banks(t))
    kv_slots = kv_banks.bufs * t.psum_bank_bytes // bp.kv_slot()
    kv_psum = b.carve("psum", kv_banks.base, bp.kv_slot(), bufs=kv_slots)
    dq_bank = b.psum_pool(bufs=1)
    dq_slot = -(-d * 4 // 64) * 64
    dq_psum = b.carve("psum", dq_bank.base, dq_slot, bufs=t.psum_bank_bytes // dq_slot)
    kts = bp.key_tiles
    blocks = [(bi, r0, min(P, m - r0)) for bi in range(bp.batch) for r0 in range(0, m, P)]

    heads: dict[int, tuple[list[isa.TileRef], isa.TileRef, list[isa.TileRef]]] = {}

    def head(bi: int) -> tuple[list[isa.TileRef], isa.TileRef, list[isa.TileRef]]:
        """K's key tiles, Vᵀ and the PSUM accumulators of dK and dV (in that order) of head
        bi."""
        if bi not in heads:
            heads.pop(bi - 2, None)
            ks = []
            for k0, kw in kts:
                kt = pools["k"].tile(kw, (d,), dt)
                load(kt, bp.k, bi, k0, kw)
                ks.append(kt)
            vt = pools["vt"].tile(d, (n,), dt)
            load(vt, bp.v_t, bi, 0, d)
            accs = [kv_psum.tile(kw, (d,), DType.F32) for _ in range(2) for _, kw in kts]
            heads[bi] = (ks, vt, accs)
        return heads[bi]

    def dk_dv(bi: int, j: int) -> tuple[isa.TileRef, isa.TileRef]:
        accs = heads[bi][2]
        return accs[j], accs[len(kts) + j]

    state: dict[tuple[int, int, int], dict[str, isa.TileRef]] = {}

    def first_half(blk: tuple[int, int, int]) -> None:
        """Loads, D, dOᵀ, dP, dV += Pᵀ dO and dS."""
        bi, r0, rp = blk
        vt = head(bi)[1]
        s = state[blk] = {}
        for name, x in (("do", bp.d_out), ("o", bp.o), ("q", bp.q)):
            s[name] = pools["rows"].tile(rp, (d,), dt)
            load(s[name], x, bi, r0, rp)
        s["p"] = pools["p"].tile(rp, (n,), dt)
        load(s["p"], bp.p, bi, r0, rp)
        prod = pools["prod"].tile(rp, (d,), DType.F32)
        b.emit(isa.TensorTensor("dve", op="mul", dst=prod, a=s["do"], b=s["o"]))
        row = pools["d"].tile(rp, (1,), DType.F32)
        b.emit(isa.TensorReduce("dve", op="sum", dst=row, src=prod))
        do_t = pools["do_t"].tile(d, (rp,), dt)
        transpose(do_t, s["do"])
        dps = [dp_psum.tile(rp, (w,), DType.F32) for _, w in chunks]
        for (c0, w), dp in zip(chunks, dps, strict=True):
            mv = vt.cols(c0, w)
            b.emit(isa.Matmul("pe", dst=dp, stationary=do_t, moving=mv, accumulate=False))
        first = r0 == 0
        for j, (k0, kw) in enumerate(kts):
            st, acc = s["p"].cols(k0, kw), dk_dv(bi, j)[1]
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["do"], accumulate=not first))
        s["ds"] = ds = pools["ds"].tile(rp, (n,), dt)
        for (c0, w), dp in zip(chunks, dps, strict=True):
            b.emit(isa.TensorTensor("act", op="sub", dst=ds.cols(c0, w), a=dp, b=row))
        b.emit(isa.TensorTensor("dve", op="mul", dst=ds, a=ds, b=s["p"]))

    def second_half(blk: tuple[int, int, int]) -> None:
        """dK += dSᵀ Q, dSᵀ, dQ = dS K out; at a head's last block, dK and dV out."""
        bi, r0, rp = blk
        ks = heads[bi][0]
        s = state.pop(blk)
        first = r0 == 0
        # dSᵀ's transposes first and dK's matmuls behind them: TensorE works while the
        # transposes' copies leave PSUM, instead of waiting for each before its dQ matmul.
        ds_ts = [pools["ds_t"].tile(kw, (rp,), dt) for _, kw in kts]
        for (k0, kw), ds_t in zip(kts, ds_ts, strict=True):
            transpose(ds_t, s["ds"].cols(k0, kw))
        for j, (k0, kw) in enumerate(kts):
            st, acc = s["ds"].cols(k0, kw), dk_dv(bi, j)[0]
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["q"], accumulate=not first))
        dq = dq_psum.tile(rp, (d,), DType.F32)
        for j, ds_t in enumerate(ds_ts):
            b.emit(isa.Matmul("pe", dst=dq, stationary=ds_t, moving=ks[j], accumulate=j > 0))
        out = pools["dq"].tile(rp, (d,), dt)
        b.emit(isa.Activation("act", func="copy", dst=out, src=dq, scale=bp.dq.scale))
        store(bp.dq, bi, r0, out)
        if r0 + rp < m:
            return
        for j, (k0, kw) in enumerate(kts):
            for gr, acc, engine in zip((bp.dk, bp.dv), dk_dv(bi, j), ("dve", "act")):
                out = pools["dkv"].tile(kw, (d,), dt)
                if engine == "act":
                    b.emit(isa.Activation("act", func="copy", dst=out, src=acc, scale=gr.scale))
                else:
                    b.emit(isa.TensorScalar("dve", op="mul", dst=out, src=acc, scalar=gr.scale))
                store(gr, bi, k0, out)

    # TensorE's second half of a block after the next block's first half, except where the
    # next block starts a head whose dK and dV take the PSUM of the last head's (kv_sets 1)
    behind = None
    for blk in blocks:
        if behind is not None and bp.kv_sets == 1 and blk[0] != behind[0]:
            second_half(behind)
            behind = None
        first_half(blk)
        if behind is not None:
            second_half(behind)
        behind = blk
    second_half(behind)
