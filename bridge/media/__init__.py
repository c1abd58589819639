"""A request's media: found in its body, checked from their header bytes, decoded to what the towers see.

May import: head, host, gguf.
"""
