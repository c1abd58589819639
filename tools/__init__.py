"""User-facing commands beyond serving: decide, bench-head, and the tools built on them."""
