"""Schedule templates: how a kernel's loops are tiled, vectorized, parallelized and bound to GPU threads.

A template meets the operator computes of `ember.ops` through stage tags and attributes (`attrs["template"]`,
`materialize`, `row_axes`); its knobs are searched by `ember.tune` through `ember.te.config`. This package sits
between `ember.te` and `ember.ops`: it imports te, tir and target only, never the op library or the graph IR.

- `flat`: the default schedules (fuse, vectorize, parallelize each root stage; injective rows);
- `nn`: GEMM on packed panels, direct convolution, window and row reductions (`schedule_nn`);
- `nchwc`: convolution and window reductions in the blocked layout NCHW[x]c;
- `gpu`: every kernel bound to GPU threads, with GEMM, rows and conv templates (`schedule_gpu`).
"""
