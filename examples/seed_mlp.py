"""Inference of the seed MLP through kiln, checked against eager.

    make serve                                       # in another terminal
    TRITON_INTERPRET=1 .venv/bin/python examples/seed_mlp.py    # TRITON_INTERPRET=1: no GPU

Exits 1 (FAILED) when a graph ran eagerly instead of through kiln, 1 (MISMATCH) when the
outputs differ from eager's.

Environment: KILN_URL (default http://127.0.0.1:8000), KILN_MODE, KILN_CACHE_DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.models import SeedMLP, verdict  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SeedMLP().to(args.device).eval()
    x = torch.randn(args.batch, 128, device=args.device)
    compiled = torch.compile(model, backend="kiln")
    with torch.no_grad():
        expected = model(x)
        got = compiled(x)
        again = compiled(x)
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-4) and torch.equal(got, again)
    print(f"max abs diff vs eager: {(got - expected).abs().max().item():.3g}")
    return verdict(ok)


if __name__ == "__main__":
    sys.exit(main())
