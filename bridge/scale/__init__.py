"""Scale-out: replicas of the server behind Ray Serve.

May import: head, host, gguf, media, llama, model, server.
"""
