"""Scale-out: replicas of the server behind Ray Serve.

May import: head, host, gguf, demo, media, llama, config, model, service, server.
"""
