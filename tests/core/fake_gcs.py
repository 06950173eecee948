"""A gs:// that lives in a local folder, reached through the same code as the real one.

Real gs:// takes two roads: etils.epath (orbax's directories and commit files, the workdir's
JSON files) goes through fsspec's "gs" filesystem, and orbax's arrays go through tensorstore's
GCS driver over HTTP. Both are pointed at `<root>/<bucket>/<key>`:
- `BucketFileSystem` is fsspec's "gs" filesystem here (gcsfs's place); like an object store it
  refuses appends (no "a" or "+" mode).
- `serve(root)` is a minimal GCS JSON API (media download with ranges and generation
  preconditions, media upload, delete, list) for tensorstore, which is pointed at it by
  TENSORSTORE_GCS_HTTP_URL (GOOGLE_AUTH_TOKEN_FOR_TESTING skips authentication).
- orbax asks google-cloud-storage whether a bucket has a hierarchical namespace before deleting;
  a flat bucket is answered here.

Run as a program (`python -m tests.core.fake_gcs <module> [args]`), it installs the fake from
FAKE_GCS_ROOT and runs `<module>` as __main__: how the kill tests start `launch.train`.
"""

import hashlib
import http.server
import json
import os
import runpy
import sys
import threading
import urllib.parse

import fsspec
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem


class BucketFileSystem(DirFileSystem):
    protocol = ("gs", "gcs")
    root: str | None = None  # set by `install`

    def __init__(self, **storage_options):  # epath passes gcsfs's options (finalize_on_close)
        del storage_options
        super().__init__(path=self.root, fs=LocalFileSystem())

    def open(self, path, mode="rb", *args, **kwargs):
        if "a" in mode or "+" in mode:
            raise OSError(f"gs:// objects cannot be appended to or updated in place ({mode=})")
        return super().open(path, mode, *args, **kwargs)


def install(root: str, url: str | None = None) -> None:
    """Make gs://bucket/key mean `<root>/bucket/key` in this process."""
    from orbax.checkpoint._src.path import gcs_utils

    BucketFileSystem.root = root
    fsspec.register_implementation("gs", BucketFileSystem, clobber=True)
    fsspec.register_implementation("gcs", BucketFileSystem, clobber=True)
    fsspec.filesystem("gcs").clear_instance_cache()
    gcs_utils.is_hierarchical_namespace_enabled = lambda path: False
    if url:
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
        os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "fake"


def _generation(path: str) -> int:
    stat = os.stat(path)  # every write replaces the file: a new inode and mtime
    digest = hashlib.sha256(f"{stat.st_ino}:{stat.st_mtime_ns}".encode()).digest()
    return int.from_bytes(digest[:7], "big") + 1  # positive; 0 means "does not exist"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = ""
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._reply(code, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _parse(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.split("/")  # '', [upload,] storage, v1, b, <bucket>[, o[, <name>]]
        if parts[1] == "upload":
            parts = parts[1:]
        bucket = urllib.parse.unquote(parts[4]) if len(parts) > 4 else ""
        name = urllib.parse.unquote("/".join(parts[6:])) if len(parts) > 6 else None
        return bucket, name, query

    def _file(self, bucket: str, name: str) -> str:
        return os.path.join(self.root, bucket, name)

    def _precondition_failed(self, path: str, query: dict) -> bool:
        generation = _generation(path) if os.path.isfile(path) else 0
        if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != generation:
            return True
        return "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"]) == generation

    def _metadata(self, bucket: str, name: str) -> dict:
        path = self._file(bucket, name)
        size, generation = os.path.getsize(path), _generation(path)
        return {"bucket": bucket, "name": name, "size": str(size), "generation": str(generation)}

    def do_GET(self):
        bucket, name, query = self._parse()
        if name is None and self.path.split("?")[0].rstrip("/").endswith("/o"):
            return self._list(bucket, query)
        if name is None:
            return self._json(200, {"name": bucket})
        path = self._file(bucket, name)
        with self.lock:
            if not os.path.isfile(path):
                return self._json(404, {"error": {"code": 404, "message": "not found"}})
            if self._precondition_failed(path, query):
                code = 304 if "ifGenerationNotMatch" in query else 412
                return self._reply(code, headers={"x-goog-generation": str(_generation(path))})
            if query.get("alt") != "media":
                return self._json(200, self._metadata(bucket, name))
            with open(path, "rb") as f:
                data = f.read()
            generation = _generation(path)
        headers = {"x-goog-generation": str(generation)}
        ranged = self.headers.get("Range")
        if ranged:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            start = int(first) if first else max(len(data) - int(last), 0)
            end = int(last) if first and last else len(data) - 1
            body = data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(data)}"
            return self._reply(206, body, headers)
        return self._reply(200, data, headers)

    def _list(self, bucket: str, query: dict) -> None:
        prefix = query.get("prefix", "")
        start, end = query.get("startOffset", ""), query.get("endOffset")
        base = os.path.join(self.root, bucket)
        items = []
        for folder, _, files in os.walk(base):
            for file in files:
                name = os.path.relpath(os.path.join(folder, file), base).replace(os.sep, "/")
                if name.startswith(prefix) and name >= start and (end is None or name < end):
                    items.append(self._metadata(bucket, name))
        items.sort(key=lambda item: item["name"])
        self._json(200, {"kind": "storage#objects", "items": items})

    def do_POST(self):
        bucket, _, query = self._parse()
        name = query["name"]
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = self._file(bucket, name)
        with self.lock:
            if self._precondition_failed(path, query):
                return self._json(412, {"error": {"code": 412, "message": "precondition"}})
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.upload-{threading.get_ident()}"
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, path)  # an object appears whole, as on GCS
            return self._json(200, self._metadata(bucket, name))

    def do_DELETE(self):
        bucket, name, query = self._parse()
        path = self._file(bucket, name)
        with self.lock:
            if not os.path.isfile(path):
                return self._json(404, {"error": {"code": 404, "message": "not found"}})
            if self._precondition_failed(path, query):
                return self._json(412, {"error": {"code": 412, "message": "precondition"}})
            os.remove(path)
            return self._reply(204)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a killed client's socket
            super().handle_error(request, client_address)


def serve(root: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Start the JSON API for `root` on a free local port; returns (server, url)."""
    handler = type("Handler", (_Handler,), {"root": root})
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


if __name__ == "__main__":
    install(os.environ["FAKE_GCS_ROOT"])  # the URL comes in the environment
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
