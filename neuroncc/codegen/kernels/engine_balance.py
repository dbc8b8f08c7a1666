"""EngineBalancer: which of the engines that can run an ALU instruction a kernel gives it, by
the busy time each has been given so far. Row kernels (emit_fused) and dot products
(emit_gemv) spread their work with it.

Note [balance in loops]: the balancer's state (how far each engine is ahead of the least busy)
takes a new value at almost every step of a long row kernel and never repeats, so no two of a
loop's iterations meet the same state and the loop places none of them (Note [instruction
loops]): a log-softmax over a 151936-word vocabulary emitted all 892 of its steps, and the LM
head's matmul epilogue all 298. A long loop's emitter restarts the balance every few
iterations instead (`restart`; attention every pipeline step), so its choices repeat with
that period. What that costs in device time, trn2, against the unbroken balance (measured
for issue 20's stop 39, figures in its closing note): row kernels restarted every 2 groups
gave 3-14% less at 65536 x 4096 (softmax, LayerNorm, RMSNorm, GELU) and within 0.3% at
16384 x 16384; every group, LayerNorm at 16384 x 16384 lost 3%.
"""

from __future__ import annotations

from dataclasses import replace

from neuroncc.codegen.hardware import costs, isa
from neuroncc.codegen.hardware.targets import Target


class EngineBalancer:
    """Spreads a kernel's ALU instructions over the engines that can run them: each goes to the
    candidate with the least estimated busy time so far (costs.instr_ns), so VectorE, GpSimdE
    and ScalarE work side by side instead of queueing on one."""

    def __init__(self, t: Target) -> None:
        self.t = t
        self.busy: dict[str, float] = {"dve": 0.0, "pool": 0.0, "act": 0.0}

    def candidates(self, ins: isa.Instr) -> tuple[str, ...]:
        # Reductions stay on VectorE, the fastest at them: they sit on each row's critical path.
        if isinstance(ins, (isa.Activation, isa.ActivationReduce)):
            return ("act",)
        if isinstance(ins, (isa.TensorCopy, isa.TensorScalar)) or _scalar_affine(ins):
            # ScalarE applies a per-partition scale or bias as part of an activation.
            engines = ("dve", "act", "pool")
        elif isinstance(ins, (isa.TensorTensor, isa.Select)):
            engines = ("dve", "pool")
        else:
            return (ins.engine,)
        if self.t.vector_gpsimd_share_sbuf:
            engines = tuple(e for e in engines if e != "pool")
        return engines

    def restart(self) -> None:
        """Balance from here as if nothing had been placed: a loop's steps then choose alike
        (Note [instruction loops])."""
        self.busy = dict.fromkeys(self.busy, 0.0)

    def state(self) -> tuple:
        """How far each engine is ahead of the least busy, to the picosecond: what the next
        choices depend on."""
        least = min(self.busy.values())
        return tuple(sorted((e, round(b - least, 3)) for e, b in self.busy.items()))

    def place(self, ins: isa.Instr) -> isa.Instr:
        options = [replace(ins, engine=e) for e in self.candidates(ins)]
        best = min(options, key=lambda o: self.busy.get(o.engine, 0.0) + costs.instr_ns(o, self.t))
        self.busy[best.engine] = self.busy.get(best.engine, 0.0) + costs.instr_ns(best, self.t)
        return best


def _scalar_affine(ins: isa.Instr) -> bool:
    """x (+-*) a per-partition scalar: what an activation's scale/bias operand computes."""
    return (
        isinstance(ins, isa.TensorTensor)
        and ins.op in ("add", "sub", "mul")
        and ins.dst.free_elems > 1
        and ins.b.free_elems == 1
        and ins.a.free_elems == ins.dst.free_elems
        and ins.dst.dtype.is_float
    )
