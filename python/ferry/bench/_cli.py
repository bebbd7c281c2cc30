"""_cli.py — what the Python benchmarks' command lines share."""

import argparse


def positive_int(value):
    """An argparse type: an int greater than 0 (a count of repeats, tensors, MiB, ...)."""
    parsed = int(value)
    if parsed <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return parsed
