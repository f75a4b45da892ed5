"""Train a small GPT a few steps through kiln; print the losses beside eager's.

    make serve                                                   # in another terminal
    TRITON_INTERPRET=1 .venv/bin/python examples/train_gpt.py --steps 5   # no GPU: interpreter

Exits 1 (FAILED) when a graph ran eagerly instead of through kiln, 1 (MISMATCH) when the
losses differ from eager's.

Forward and backward graphs both go through kiln (AOTAutograd). Environment: KILN_URL,
KILN_MODE, KILN_CACHE_DIR (see docs/client.md).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.models import GPT, GPTConfig, gpt_batches, train, verdict  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    cfg = GPTConfig(d=args.d, layers=args.layers)
    torch.manual_seed(0)
    eager_model = GPT(cfg).to(args.device)
    kiln_model = copy.deepcopy(eager_model)
    batches = gpt_batches(cfg, args.batch, args.steps, device=args.device)

    eager_losses = train(eager_model, batches)
    kiln_losses = train(torch.compile(kiln_model, backend="kiln"), batches)
    for step, (e, k) in enumerate(zip(eager_losses, kiln_losses, strict=True)):
        print(f"step {step}: eager {e:.5f}  kiln {k:.5f}")
    ok = all(abs(e - k) <= 1e-3 * max(1.0, abs(e)) for e, k in
             zip(eager_losses, kiln_losses, strict=True))
    return verdict(ok)


if __name__ == "__main__":
    sys.exit(main())
