"""_cli.py — what the Python benchmarks' command lines share."""

import argparse


def positive_int(value):
    """An argparse type: an int greater than 0 (a count of repeats, tensors, MiB, ...)."""
    parsed = int(value)
    if parsed <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return parsed


def non_negative_int(value):
    """An argparse type: an int of 0 or more (warm-up counts, MiB of scratch memory)."""
    parsed = int(value)
    if parsed < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return parsed


def non_negative_float(value):
    """An argparse type: a finite float of 0 or more (milliseconds, seconds)."""
    parsed = float(value)
    if not (parsed >= 0 and parsed != float("inf")):
        raise argparse.ArgumentTypeError("must be a finite number, 0 or more")
    return parsed


def cuda_device(value):
    """An argparse type: "cuda", "cuda:N" or "N", checked on the command line (as the C benchmarks do), so a bad
    --device is a usage error (exit 2) with or without a GPU."""
    text = value[5:] if value.startswith("cuda:") else ("0" if value == "cuda" else value)
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a CUDA device (cuda, cuda:N or N), got {value!r}")
    return f"cuda:{int(text)}"


def default_device():
    """The default --device: LOCAL_RANK's GPU under torchrun, else cuda:0 (the README's rule for benchmarks)."""
    import os

    rank = os.environ.get("LOCAL_RANK", "")
    return f"cuda:{int(rank)}" if rank.isdigit() else "cuda:0"
