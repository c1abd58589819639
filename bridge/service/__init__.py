"""The decision service: one typed request in, one typed Decision out, whatever the front door (HTTP routes,
the CLI, Ray replicas): validation, media checks and decoding, coalescing, the worker, timings.

May import: head, catalogue, host, gguf, demo, media, llama, config, model.
"""
