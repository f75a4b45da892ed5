"""Building and running a graph: `build` -> `Built` (kernel files, launches, ATen calls),
parallel ahead-of-time compiles, CUDA graphs and the CPU interpreter's fixes."""
