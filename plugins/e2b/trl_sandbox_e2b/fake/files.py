"""The fake envd's ``/files`` route: ``GET`` downloads a file, ``POST`` uploads one (multipart, or
``application/octet-stream`` as envd 0.5.7 takes it), making missing parent directories, and
answers ``[{"name", "type", "path"}]``. The bytes move through a command inside the sandbox's
container, so paths resolve as the sandbox sees them."""

from __future__ import annotations

import posixpath
import subprocess
from typing import Any

from trl_sandbox.remote.fake_container import FileError


def _multipart(body: bytes, content_type: str) -> list[tuple[dict[str, str], bytes]]:
    """Byte-exact multipart/form-data parsing: [(disposition parameters, data)]."""
    boundary = next((v.strip().partition("=")[2].strip('"') for v in content_type.split(";")
                     if v.strip().lower().startswith("boundary=")), "")
    if not boundary:
        raise ValueError("no multipart boundary")
    parts = []
    for chunk in body.split(b"--" + boundary.encode())[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, data = chunk.partition(b"\r\n\r\n")
        params: dict[str, str] = {}
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                for item in value.split(";")[1:]:
                    k, _, v = item.strip().partition("=")
                    params[k.lower()] = v.strip('"')
        parts.append((params, data[:-2] if data.endswith(b"\r\n") else data))
    return parts


def handle(handler: Any, sandbox: Any, query: dict[str, str], body: bytes) -> None:
    container = sandbox.container
    if handler.command == "GET":
        path = query.get("path", "")
        try:
            data = container.read(path)
        except FileError as exc:
            status = 404 if exc.errno == 2 else 400
            return handler.error(status, f"path '{path}' {'does not exist' if status == 404 else exc.strerror}")
        return handler.send(200, raw=data, content_type="application/octet-stream")
    content_type = handler.headers.get("Content-Type", "")
    if content_type.startswith("multipart/"):
        uploads = [(query.get("path") or params.get("filename", ""), data)
                   for params, data in _multipart(body, content_type)]
    else:
        uploads = [(query.get("path", ""), body)]
    written = []
    for path, data in uploads:
        if not path.startswith("/"):
            path = posixpath.join("/home/user", path)
        subprocess.run(container.argv(["mkdir", "-p", "--", posixpath.dirname(path)]), env=container.env,
                       capture_output=True, timeout=60)
        try:
            container.write(path, data)
        except FileError as exc:
            return handler.error(400, f"cannot write '{path}': {exc.strerror}")
        written.append({"name": posixpath.basename(path), "type": "file", "path": path})
    handler.send(200, written)
