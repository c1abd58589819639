"""llama.cpp through llama-cpp-python: the backbone, its log, output-embedding rows, the prefix cache,
mtmd's towers.

May import: head, host, gguf, media.
"""
