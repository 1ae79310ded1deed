"""Ember: a deep learning compiler.

m = ember.compile("model.onnx", target="c")
y = m(x)

from ember import te
s = te.create_schedule(C)
print(ember.lower(s, [A, B, C]))
f = ember.build(s, [A, B, C], target="c")
"""

from . import te, tir
from .build import build, lower
from .target import Target

__version__ = "0.1.0"


def compile(model, target=None, input_shapes=None, fallback=True, opt_level=3, disabled_passes=(),  # noqa: A001
            tuning_log=None, max_elements=None, max_iterations=None, dynamic=None, dynamic_bounds=None,
            example_inputs=None, dynamic_shapes=None):  # fmt: skip
    """Compile a model (ONNX file path, onnx.ModelProto, ember Graph, torch nn.Module with its example inputs,
    torch.export.ExportedProgram, .tflite file, Keras model or SavedModel directory); see `ember.compiler.compile`.
    A module's example inputs come second (`ember.compile(module, (x,))`) or as `example_inputs=`
    (`ember.compile(module, example_inputs=(x,), target="c")`).
    `target`: "c" or "llvm" (default: "c", or "llvm" where no C compiler is installed).
    `tuning_log`: a log written by `ember tune`, whose best config per workload is applied.
    `max_elements` (per tensor, default 2^34 or $EMBER_MAX_ELEMENTS) and `max_iterations` (per kernel's loops,
    default 2^40 or $EMBER_MAX_ITERATIONS) bound the work: a model beyond them raises WorkLimitError.
    A model's symbolic dims (ONNX dim_params, an ExportedProgram's or `dynamic_shapes`' torch.export.Dims) stay
    symbolic on the c target, bounded by `dynamic_bounds={"S": (1, 512)}`: compiled once, it runs at every size
    within the bounds. `input_shapes` fixes an input's dims; `dynamic=False` (and the GPU targets, with a warning)
    specialize them (a symbolic leading dim becomes 1)."""
    from .compiler import compile as _compile

    return _compile(model, target, input_shapes, fallback, opt_level, disabled_passes, tuning_log, max_elements,
                    max_iterations, dynamic, dynamic_bounds, example_inputs, dynamic_shapes)  # fmt: skip


def load(path):
    """Load a model saved with `CompiledModel.save(path)`."""
    from .compiler import load as _load

    return _load(path)


def quantize(model, calibration_data, **options):
    """Post-training quantization of a float ONNX model (path or ModelProto) into an onnx.ModelProto: QDQ int8 by
    default, or bf16 (`precision="bf16"`); `calibration_data` is an iterable of input dicts. See
    `ember.quantization.quantize` for the options (method, percentile, activation_dtype, exclude, min_sqnr, ...)."""
    from .quantization import quantize as _quantize

    return _quantize(model, calibration_data, **options)


__all__ = ["Target", "build", "compile", "load", "lower", "quantize", "te", "tir"]
