"""Scale-out: replicas of the server behind Ray Serve.

May import: head, catalogue, host, gguf, demo, media, llama, config, model, service, server.
"""
