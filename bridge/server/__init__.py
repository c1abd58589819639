"""The HTTP server (aiohttp): the app, routes, bodies, auth, middleware, metrics, OpenAPI.

May import: head, catalogue, host, gguf, demo, media, llama, config, model, service.
"""
