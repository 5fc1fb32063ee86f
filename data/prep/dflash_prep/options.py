"""argparse types for numeric options: an impossible value (--max-len -5, --workers 0, --top-p 2, a NaN) is a
usage error naming the option, instead of a run that silently does something else."""
import argparse
import math


def _number(text: str, kind):
    try:
        v = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


def positive_int(text: str) -> int:
    v = _number(text, int)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def non_negative_int(text: str) -> int:
    v = _number(text, int)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must not be negative")
    return v


def positive_float(text: str) -> float:
    v = _number(text, float)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} must be greater than 0")
    return v


def non_negative_float(text: str) -> float:
    v = _number(text, float)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must not be negative")
    return v


def probability(text: str) -> float:
    """A value in (0, 1], such as top_p."""
    v = _number(text, float)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{v} must be in (0, 1]")
    return v
