"""OpDef entries: attribute checking, arity, lookup, shape rules rejecting bad inputs."""

import numpy as np
import pytest

from ember.graph import TensorType
from ember.ops import OPS, AttrError, OpDef, Pattern, ShapeError, get_op
from ember.ops.opdef import Attr, register


def test_check_attrs_fills_defaults_coerces_and_rejects_unknown():
    conv = get_op("Conv")
    attrs = conv.check_attrs({"strides": [1, 1], "pads": (0, 0, 0, 0), "dilations": [1, 1]})
    assert attrs == {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1}
    with pytest.raises(AttrError, match="node 'c': unknown attribute\\(s\\) auto_pad for Conv"):
        conv.check_attrs({"strides": [1], "pads": [0, 0], "dilations": [1], "auto_pad": "VALID"}, "node 'c'")
    with pytest.raises(AttrError, match="Conv needs attribute 'strides'"):
        conv.check_attrs({})
    with pytest.raises(AttrError, match="mode='cubic' is invalid; expected one of 'constant', 'reflect'"):
        get_op("Pad").check_attrs({"pads": [0, 0], "mode": "cubic"})


def test_arity_and_lookup_errors():
    with pytest.raises(AttrError, match="Add takes 2 inputs, got 3"):
        get_op("Add").check_arity(3)
    get_op("Concat").check_arity(7)
    with pytest.raises(KeyError, match="no operator 'Relu6'; did you mean Relu"):
        get_op("Relu6")


def test_every_entry_is_complete():
    for name, opdef in OPS.items():
        assert opdef.name == name and isinstance(opdef.pattern, Pattern)
        assert callable(opdef.infer) and callable(opdef.reference)
        assert opdef.compute is None or callable(opdef.compute)  # filled by the lowering layer


def test_shape_rules_reject_bad_inputs_clearly():
    f32 = lambda *s: TensorType(s, "float32")  # noqa: E731
    with pytest.raises(ShapeError, match="do not broadcast"):
        get_op("Add").infer({}, f32(2, 3), f32(4))
    with pytest.raises(ShapeError, match="MatMul inner dims differ"):
        get_op("MatMul").infer({}, f32(2, 3), f32(4, 5))
    with pytest.raises(ShapeError, match="cannot reshape"):
        get_op("Reshape").infer({"shape": (5,)}, f32(2, 3))


def test_registering_twice_is_an_error_and_a_new_op_needs_one_entry():
    entry = OpDef("Twice", Pattern.ELEMWISE, (Attr("k", "float", 2.0),), lambda a, x: x, lambda a, x: x * a["k"])
    register(entry)
    try:
        with pytest.raises(ValueError, match="defined twice"):
            register(entry)
        (y,) = get_op("Twice").reference(entry.check_attrs({}), np.ones(3, np.float32))
        t = TensorType((3,), "float32")
        assert (y == 2).all() and get_op("Twice").infer({}, t) == (t,)
    finally:
        del OPS["Twice"]


def test_attach_fills_the_lowering_slots():
    from ember.ops import attach

    before = get_op("Relu")
    try:
        entry = attach("Relu", compute=lambda a, x: x)
        assert get_op("Relu") is entry and entry.compute is not None and entry.schedule is None
        (y,) = entry.reference({}, np.array([-1.0, 2.0]))
        assert y.tolist() == [0.0, 2.0]
    finally:
        OPS["Relu"] = before
