"""GGUF files without llama.cpp: the header reader, the writer, llama.cpp's `clef` format and its
embedded head, split and join, projector headers.

May import: head, catalogue, host.
"""
