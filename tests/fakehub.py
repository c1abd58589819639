"""A fake Hugging Face Hub on 127.0.0.1: the resolve endpoint with ETag/size headers and Range
requests, plus faults (a connection dropped mid-file, a lying sha256)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    files: dict[tuple[str, str], bytes]
    drop_after: dict[tuple[str, str], int] = field(default_factory=dict)  # first GET stops after n bytes
    wrong_sha: set[tuple[str, str]] = field(default_factory=set)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{owner}/{repo}/resolve/{revision}/{filename:.+}", self.resolve)
        app.router.add_get("/api/models/{owner}/{repo}/tree/{revision}", self.tree)
        return app

    async def tree(self, request: web.Request) -> web.Response:
        repo = f"{request.match_info['owner']}/{request.match_info['repo']}"
        files = [{"type": "file", "path": f, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                 for (r, f), data in sorted(self.files.items()) if r == repo]
        if not files:
            return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
        return web.json_response(files)

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        key = (f"{request.match_info['owner']}/{request.match_info['repo']}", request.match_info["filename"])
        self.requests.append((request.method, request.path, request.headers.get("Range")))
        if key not in self.files:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        data = self.files[key]
        sha = hashlib.sha256(data if key not in self.wrong_sha else data + b"tampered").hexdigest()
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{sha}"', "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        start, end = 0, len(data) - 1
        rng = request.headers.get("Range")
        if rng:
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start, end = int(first), min(int(last), len(data) - 1) if last else len(data) - 1
        body = data[start:end + 1]
        status = 206 if rng else 200
        if rng:
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        response = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(body))})
        await response.prepare(request)
        cut = self.drop_after.pop(key, None)
        if cut is not None:
            await response.write(body[:cut])
            await asyncio.sleep(0.05)
            request.transport.close()  # the connection breaks mid-file
            return response
        for i in range(0, len(body), 1 << 20):
            await response.write(body[i:i + (1 << 20)])
        await response.write_eof()
        return response


class RunningHub:
    def __init__(self, hub: Hub):
        self.hub = hub
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.hub.app(), access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> "RunningHub":
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
