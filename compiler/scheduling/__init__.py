"""Per-kernel choices (`Schedule`: variant and config of each kernel) and the heuristic that
fills them; the tuner searches over the same `Schedule`."""
