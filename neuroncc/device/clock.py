"""The device's simulated clock and `torch.neuron.Event` (Note [device clock]).

Note [device clock]: the process's NeuronCore keeps a simulated clock that every execution on
it advances: each compiled graph by its simulated device time, each eager op by its simulated
time plus a launch overhead (LAUNCH_NS). Ops run to completion one after another (the
simulator has no streams), so `synchronize()` has nothing to wait for and an event's time is
the clock when it is recorded. The clock is derived from stats() (device_seconds,
eager_device_seconds, eager_executions), so `neuroncc.reset_stats()` restarts it; events
recorded across a reset do not compare.

LAUNCH_NS is an assumption, not a measured figure: the time the host runtime takes to start
one eager op's program on the core (an `nrt_execute` of a small NEFF). No published Neuron
figure was found; 20 µs sits between a CUDA kernel launch (about 5 µs) and the 50-70 µs of
Python dispatch measured for a Python PrivateUse1 backend (ref-device-distributed-nki.md).
"""

from __future__ import annotations

from neuroncc.runtime.stats import STATS

LAUNCH_NS = 20_000  # per eager op, an assumption (above)


def now_ns() -> float:
    """The simulated clock of the process's NeuronCore, in ns."""
    device = STATS.value("device_seconds") + STATS.value("eager_device_seconds")
    return device * 1e9 + STATS.value("eager_executions") * LAUNCH_NS


class Event:
    """`torch.neuron.Event`: a point on the simulated clock (as `torch.cuda.Event` on the GPU's)."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing
        self.at: float | None = None

    def record(self, stream=None) -> None:
        self.at = now_ns()

    def synchronize(self) -> None:
        """Nothing to wait for: every op has run to completion (Note [device clock])."""

    def wait(self, stream=None) -> None:
        """Nothing to wait for (one stream)."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        """Simulated milliseconds from this event to `end`."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True")
        if self.at is None or end.at is None:
            raise RuntimeError("elapsed_time needs both events recorded")
        return (end.at - self.at) * 1e-6
