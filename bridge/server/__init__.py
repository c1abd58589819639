"""The HTTP server (aiohttp): routes, bodies, auth, middleware, metrics, OpenAPI. May import: head, host, gguf, media, llama, model."""
