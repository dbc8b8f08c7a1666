"""Transposes on TensorE: a [p, f] SBUF tile times the identity (`nc_transpose`), the result
copied out of PSUM. Matmuls transpose A and W^T with it (emit_matmul), attention Q, K and P
(emit_attention), dot products their results (emit_gemv, emit_few_rows).

Every target has them. NC-v3 on have an exact transpose mode; NC-v2 (trn1) multiplies by the
identity, which is exact for finite data, and the NKI docs say so: "On NeuronCore-v2, Tensor
Engine transpose is not bit-accurate if the input data contains NaN/Inf" (`nc_transpose`). The
simulator computes that spreading (semantics.prepare_matmul) and warns where it happens."""

from __future__ import annotations

from neuroncc.codegen.executable.builder import ProgramBuilder
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.emit import EmitCtx, P
from neuroncc.ir.types import DType

PSUM_TRANSPOSE_BANKS = 1  # banks left for transposes; the rest accumulate matmul outputs


def identity(b: ProgramBuilder, dtype: DType) -> isa.TileRef:
    """A [128, 128] identity matrix in SBUF, the moving operand of TensorE transposes."""
    ident = b.sbuf_pool(P * dtype.itemsize, bufs=1).tile(P, (P,), dtype)
    grid = b.sbuf_pool(P * 4, bufs=1).tile(P, (P,), DType.F32)
    b.emit(isa.Iota("pool", dst=grid, base=0.0, pstep=1.0, fstep=-1.0))  # p - f
    b.emit(isa.TensorScalar("dve", op="eq", dst=ident, src=grid, scalar=0.0))
    return ident


class PeTransposer:
    """Transposes [p <= 128, f <= 128] SBUF tiles on TensorE: out[f, p] = x.T @ I_p."""

    def __init__(
        self,
        ctx: EmitCtx,
        dtype: DType,
        banks: int = PSUM_TRANSPOSE_BANKS,
        engine: str | None = None,
    ) -> None:
        """`engine` evacuates every result ("act" or "dve"); None alternates the two."""
        b = ctx.b
        self.b, self.dtype, self.engine = b, dtype, engine
        self.ident = identity(b, dtype)
        bank = b.psum_pool(bufs=banks)
        # Four [128, 128] fp32 results share one 2 KiB bank, so transposes pipeline.
        self.psum = b.carve("psum", bank.base, P * 4, bufs=4 * banks)
        self._engine = 0

    def align(self) -> None:
        """The next transpose at a whole turn of the PSUM slots (Note [aligned steps] in
        emit_fused.py): safe anywhere, as each result is copied out as it is made."""
        self.psum.align(self.psum.bufs)

    def loop_state(self) -> int:
        """The engine the next result leaves PSUM on, where they alternate."""
        return self._engine

    def __call__(self, dst: isa.TileRef, src: isa.TileRef) -> None:
        """dst[f, p] (SBUF) = src[p, f] transposed."""
        p, f = src.np, src.free_elems
        ps = self.psum.tile(f, (p,), DType.F32)
        eye = self.ident.rows(p).cols(0, p)
        self.b.emit(
            isa.Matmul("pe", dst=ps, stationary=src, moving=eye, accumulate=False, transpose=True)
        )
        self.b.emit(isa.TensorCopy(self.evacuation_engine(), dst=dst, src=ps))

    def evacuation_engine(self) -> str:
        """The engine given, else alternate PSUM evacuations between ScalarE and VectorE."""
        if self.engine is not None:
            return self.engine
        self._engine ^= 1
        return "act" if self._engine else "dve"
