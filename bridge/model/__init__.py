"""A served model: the registry, integrity checks, memory plans, the one checked way to load, the
ClefModel pipeline and its worker.

May import: head, host, gguf, media, llama.
"""
