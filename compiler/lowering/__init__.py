"""From an aten FX graph to the IR `Program`: tracing, decomposition, the lowering passes and
fusion planning (which kernels exist and what each holds)."""
