"""The kiln.graph/1 wire format and the keys built on it: encode (`to_wire`), decode and
validate (`from_wire`, the `Graph`), its limits, graph hashes, targets and tuning keys, and
seeded inputs for a graph. Needs torch, never Triton or the rest of the compiler."""
