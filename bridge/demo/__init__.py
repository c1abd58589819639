"""The built-in demo models' writers: a random qwen35 backbone with a vision projector, a random Clef-omni
(qwen3vlmoe with a vision + audio projector), and their random heads, from numpy and gguf-py.

May import: head, catalogue, host, gguf.
"""
