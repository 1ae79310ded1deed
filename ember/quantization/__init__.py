"""Post-training quantization: `ember.quantize(model, calibration_data)` -> an ONNX QDQ model (int8), or a model
whose Conv/MatMul/Gemm read bfloat16-rounded operands (`precision="bf16"`); the calibration methods in
`calibrate`, the ONNX rewriting in `qdq`, the driver and its sensitivity report in `ptq`."""

from .calibrate import METHODS, RangeCollector, entropy_threshold, percentile_range
from .ptq import PRECISIONS, LayerReport, QuantizationReport, QuantizeResult, quantize, quantize_model, read_report
from .qdq import QuantizeError

__all__ = [
    "METHODS",
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
