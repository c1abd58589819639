"""The HTTP server (aiohttp): the app, routes, bodies, auth, middleware, metrics, OpenAPI.

May import: head, host, gguf, demo, media, llama, config, model, service.
"""
