"""The `neuron` device: Trainium as a native PyTorch device, backed by the simulated NeuronCore.

    x = torch.randn(4, 4, device="neuron")      # no import of neuroncc needed
    y = x @ x                                   # compiled, run on the simulator

PyTorch autoloads device extensions from the `torch.backends` entry-point group on every
`import torch`; `autoload` is neuroncc's (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off). It
registers `neuron` as PyTorch's PrivateUse1 device with `torch.neuron` (module.py) and a kernel
per ATen op (ops.py); the compiler itself is imported on the first op that needs it. The APIs
it uses are PyTorch's experimental Python backend ones (torch is pinned): `register` checks
them with a self-test and, if anything is missing or taken, leaves `neuron` unavailable with
the reason in `unavailable()` and a warning, never an error in `import torch`.
"""

from __future__ import annotations

import warnings

_state: dict[str, object] = {"registered": False, "why": None}


def autoload() -> None:
    """The `torch.backends` entry point: register, and never raise (a raise here would break
    every `import torch` in the environment)."""
    try:
        register()
    except Exception as e:  # noqa: BLE001 (anything: import torch must go on)
        _state["why"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        warnings.warn(
            f"neuroncc: the neuron device is unavailable: {_state['why']}; "
            "torch.compile(backend='neuron') on CPU tensors still works",
            stacklevel=2,
        )


def register() -> None:
    """Register the `neuron` device (once); raises RuntimeError saying why it cannot."""
    if _state["registered"]:
        return
    import torch

    missing = [
        name
        for owner, name in (
            (torch._C, "_acc"),
            (torch._C, "_construct_storage_from_data_pointer"),
            (torch.utils.backend_registration, "_setup_privateuseone_for_python_backend"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        raise RuntimeError(f"this torch {torch.__version__} lacks {', '.join(missing)}")
    taken = torch._C._get_privateuse1_backend_name()
    if taken not in ("privateuseone", "neuron"):
        raise RuntimeError(f"PrivateUse1 is already the {taken!r} device")
    from neuroncc.device import memory, module, ops

    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        rename="neuron", backend_module=module
    )
    ops.register_all()
    memory.patch_storage_constructor()
    memory.patch_pin_memory()
    module.patch_accelerator()
    module.patch_generator()
    module.patch_printing()
    _self_test()
    _state["registered"] = True


def _self_test() -> None:
    """A tensor made, written and read back through the registration."""
    import torch

    t = torch.empty(3, device="neuron")
    t.copy_(torch.arange(3.0))
    if t.device.type != "neuron" or t.cpu().tolist() != [0.0, 1.0, 2.0] or not t.data_ptr():
        raise RuntimeError("the self-test of the neuron device's registration failed")


def unavailable() -> str | None:
    """Why the `neuron` device could not be registered, or None."""
    return _state["why"]  # type: ignore[return-value]
