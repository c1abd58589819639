"""What is served and whether it may be: models.toml (the registry, its keys and its writer), the integrity
checks of a GGUF and its head, provenance (pins, pairing records), memory plans and the releases' published
dimensions.

May import: head, catalogue, host, gguf, demo, media, llama.
"""
