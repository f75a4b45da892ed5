"""GPU benchmark and end-to-end scripts (not part of the shipped packages)."""
