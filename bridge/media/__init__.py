"""A request's media: found in its body, checked from their header bytes, decoded to what the towers see;
Qwen3-Omni's audio tower in numpy (audio_tower.py).

May import: head, catalogue, host, gguf.
"""
