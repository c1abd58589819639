"""A served model at run time: the one checked way to load it, the ClefModel pipeline and its worker.

May import: head, catalogue, host, gguf, demo, media, llama, config.
"""
