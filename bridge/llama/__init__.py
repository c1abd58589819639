"""llama.cpp through llama-cpp-python: the backbone (Qwen3.5's, and Qwen3-Omni's thinker in omni.py), its log,
output-embedding rows, the prefix cache, mtmd's towers.

May import: head, catalogue, host, gguf, media.
"""
