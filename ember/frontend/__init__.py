"""Frontends: model files and objects -> `ember.graph.Graph`. ONNX first (`ember.frontend.onnx`)."""
