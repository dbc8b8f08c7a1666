"""neuroncc's error types. Each names the stage it comes from; messages say what was wrong and
what is allowed."""

from __future__ import annotations


class NeuronccError(Exception):
    """Base of every error neuroncc raises on purpose."""

    stage = "neuroncc"


class OptionsError(NeuronccError, ValueError):
    stage = "options"


class UnsupportedError(NeuronccError):
    """The graph uses something neuroncc cannot compile (an ATen op without a lowering, a
    dtype the engines do not have, a symbolic shape where a static one is needed)."""

    stage = "nir"

    def __init__(self, message: str, op: str | None = None) -> None:
        self.op = op
        super().__init__(message)


class CodegenError(NeuronccError):
    stage = "program"


class CapacityError(CodegenError):
    """The graph's tensors do not fit the target's HBM. Never a reason to fall back: the same
    model would not fit the device either."""


class SimulationError(NeuronccError):
    """The simulator found the executable wrong: out-of-bounds access, capacity, or a race."""

    stage = "simulate"


class RaceError(SimulationError):
    pass


class NeuronccInternalError(NeuronccError):
    """A bug in neuroncc, not in the user's program: a pass, an emitter or the simulator failed
    (or produced something that breaks an invariant, such as a timing faster than the hardware
    allows). It names the stage, the pass and the node where it happened; the frontend adds
    where the failing graph's IR was written and the command that reproduces it."""

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        pass_name: str | None = None,
        node: str | None = None,
        dump: str | None = None,
        repro: str | None = None,
    ) -> None:
        self.stage, self.pass_name, self.node = stage, pass_name, node
        self.dump, self.repro = dump, repro
        self.message = message
        super().__init__(self._text())

    def summary(self) -> str:
        """One line: where it failed and the first line of what went wrong."""
        where = [f"stage {self.stage}"]
        if self.pass_name and self.pass_name != self.stage:
            where.append(f"pass {self.pass_name}")
        if self.node:
            where.append(f"node {self.node.splitlines()[0]}")
        first = self.message.strip().splitlines()[0] if self.message.strip() else "(no message)"
        return f"internal compiler error ({', '.join(where)}): {first}"

    def _text(self) -> str:
        rest = self.message.strip().partition("\n")[2]  # what follows the summary's line
        text = self.summary() + (f"\n{rest}" if rest else "")
        if self.dump:
            text += f"\n  the failing graph: {self.dump}"
        if self.repro:
            text += f"\n  reproduce with: {self.repro}"
        return text


def internal_error(
    e: BaseException, *, stage: str, pass_name: str | None = None
) -> NeuronccInternalError:
    """`e`, an exception that escaped neuroncc's own code, as a NeuronccInternalError naming
    the stage, the pass and the IR node being worked on: the innermost frame of e's traceback
    that holds an IR Node (a pass's or an emitter's loop variable)."""
    if isinstance(e, NeuronccInternalError):
        return e
    return NeuronccInternalError(
        f"{type(e).__name__}: {e}", stage=stage, pass_name=pass_name, node=_failing_node(e)
    )


def _failing_node(e: BaseException) -> str | None:
    from neuroncc.ir.graph import Node  # errors.py sits below every package; ir imports it
    from neuroncc.ir.printer import format_node

    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, Node):
                return format_node(value)
    return None
