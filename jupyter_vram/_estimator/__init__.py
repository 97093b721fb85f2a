"""Predict a training step's memory without a GPU: fake-tensor runs in a separate process.

Where each module here is tested: tests/INDEX.md.
"""

from .api import Comparison, Estimate, RunSummary
from .entry import estimate, estimate_generate
from .gpus import GPUS, Gpu, find_gpu
from .inputs import InputError
from .runner import EstimateError
from .step import StepSettings

__all__ = [
    "GPUS",
    "Comparison",
    "Estimate",
    "EstimateError",
    "Gpu",
    "InputError",
    "RunSummary",
    "StepSettings",
    "estimate",
    "estimate_generate",
    "find_gpu",
]
