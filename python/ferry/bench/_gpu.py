"""_gpu.py — what every Python benchmark does first: find torch and a CUDA device, or say why it cannot run.

Without torch or without a GPU a benchmark prints one line saying so ("... Nothing to do.") and exits 0, like the
C benchmarks; a --device that is not a CUDA device is an error naming it.
"""


def torch_cuda_device(program, device_arg, needs_torch_for):
    """Returns (torch, torch.device) to run on, or None after printing why the benchmark cannot run here.

    `program` prefixes the message; `needs_torch_for` says what torch is needed for. Raises ValueError when
    `device_arg` names a device that is not CUDA."""
    try:
        import torch
    except ImportError:
        print(f"{program}: torch is not installed; {needs_torch_for}. Nothing to do.")
        return None
    import ferry

    if not torch.cuda.is_available() or ferry.device_count() == 0:
        print(f"{program}: no CUDA device here; this benchmark needs a GPU. Nothing to do.")
        return None
    device = torch.device(device_arg)
    if device.type != "cuda":
        raise ValueError(f"Expected a CUDA device, but received {device}.")
    return torch, device
