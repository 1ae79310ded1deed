"""Post-training quantization: `ember.quantize(model, calibration_data)` -> an ONNX QDQ model (int8), or a model
whose Conv/MatMul/Gemm read bfloat16-rounded operands (`precision="bf16"`); the calibration methods in
`calibrate`, the ONNX rewriting in `qdq`, the driver and its sensitivity report in `ptq`.

Importing this package replaces the attribute `ember.quantize` (until then the function in ember/__init__.py)
with the package itself, as Python does for every subpackage: the package is callable, so that
`ember.quantize(model, data)` works either way."""

import sys
import types

from .calibrate import METHODS, RangeCollector, entropy_threshold, percentile_range
from .ptq import PRECISIONS, LayerReport, QuantizationReport, QuantizeResult, quantize, quantize_model, read_report
from .qdq import QuantizeError


class CallableModule(types.ModuleType):
    """This package's module type: calling it calls `quantize`."""

    def __call__(self, model, calibration_data, **options):
        return quantize(model, calibration_data, **options)


sys.modules[__name__].__class__ = CallableModule

__all__ = [
    "METHODS",
    "CallableModule",
    "PRECISIONS",
    "LayerReport",
    "QuantizationReport",
    "QuantizeError",
    "QuantizeResult",
    "RangeCollector",
    "entropy_threshold",
    "percentile_range",
    "quantize",
    "quantize_model",
    "read_report",
]
