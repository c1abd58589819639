"""A served model: the registry, integrity checks, memory plans, loading, the ClefModel pipeline, its worker. May import: head, host, gguf, media, llama."""
