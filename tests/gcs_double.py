"""A test double of the GCS JSON API that enforces ifGenerationMatch, DELETE included.

fake-gcs-server (the emulator of tests/conftest.py) ignores ifGenerationMatch on
DELETE, so the emulator cannot show that a workdir lock's release deletes only
its own version. This double implements just the calls host.paths' conditional
writes make through gcsfs, with GCS's preconditions (cloud.google.com/storage/
docs/request-preconditions: a generation that does not match is 412, "0" means
"only if absent"):

  POST   /upload/storage/v1/b/B/o?uploadType=multipart&ifGenerationMatch=G
  GET    /storage/v1/b/B/o/NAME?alt=media[&generation=G]   (x-goog-generation header)
  GET    /storage/v1/b/B/o/NAME                             (metadata)
  DELETE /storage/v1/b/B/o/NAME?ifGenerationMatch=G

Any other request is answered 501 and logged, so a test sees it. `serve()`
yields the running store: .url (for STORAGE_EMULATOR_HOST), .objects
({(bucket, name): (data, generation)}) and .log ([(method, name, status)]).
"""

import contextlib
import http.server
import itertools
import json
import re
import threading
import urllib.parse


class Store:
  """Objects and the request log of one double."""

  def __init__(self):
    self.objects: dict[tuple[str, str], tuple[bytes, int]] = {}
    self.log: list[tuple[str, str, int]] = []
    self.url = ""
    self._generations = itertools.count(1000)
    self._guard = threading.Lock()

  def precondition(self, key: tuple[str, str], query: dict) -> bool:
    """Whether ifGenerationMatch (if given) holds for the object at `key` now."""
    if "ifGenerationMatch" not in query:
      return True
    wanted = int(query["ifGenerationMatch"][0])
    current = self.objects.get(key)
    return (current is None) if wanted == 0 else (current is not None and current[1] == wanted)

  def next_generation(self) -> int:
    return next(self._generations)


def _multipart(body: bytes, content_type: str) -> tuple[dict, bytes]:
  """(metadata, data) of a multipart/related upload."""
  boundary = re.search(r'boundary="?([^";]+)"?', content_type).group(1).encode()
  parts = [p for p in body.split(b"--" + boundary) if p.strip() not in (b"", b"--")]
  contents = []
  for part in parts:
    separator = b"\r\n\r\n" if b"\r\n\r\n" in part else b"\n\n"
    content = part.split(separator, 1)[1]
    contents.append(content[:-2] if content.endswith(b"\r\n") else
                    content[:-1] if content.endswith(b"\n") else content)
  return json.loads(contents[0]), contents[1]


def _handler(store: Store):
  class Handler(http.server.BaseHTTPRequestHandler):
    """One request of gcsfs, against `store`."""

    def log_message(self, *args):  # quiet: the test reads store.log
      pass

    def _reply(self, status: int, name: str, body: bytes = b"", headers: dict | None = None):
      store.log.append((self.command, name, status))
      if status >= 400 and not body:
        body = json.dumps({"error": {"code": status, "message": "conditionNotMet"
                                     if status == 412 else "error"}}).encode()
      self.send_response(status)
      for k, v in (headers or {}).items():
        self.send_header(k, v)
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def _route(self):
      url = urllib.parse.urlsplit(self.path)
      query = urllib.parse.parse_qs(url.query)
      upload = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", url.path)
      item = re.fullmatch(r"/storage/v1/b/([^/]+)/o/(.+)", url.path)
      return url, query, upload, item

    def do_POST(self):  # pylint: disable=invalid-name
      _, query, upload, _ = self._route()
      body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
      if not upload or query.get("uploadType") != ["multipart"]:
        return self._reply(501, self.path)
      metadata, data = _multipart(body, self.headers["Content-Type"])
      key = (upload.group(1), metadata["name"])
      with store._guard:  # pylint: disable=protected-access
        if not store.precondition(key, query):
          return self._reply(412, key[1])
        generation = store.next_generation()
        store.objects[key] = (data, generation)
      self._reply(200, key[1], json.dumps({"bucket": key[0], "name": key[1], "size": str(len(data)),
                                           "generation": str(generation)}).encode(),
                  {"Content-Type": "application/json"})

    def do_GET(self):  # pylint: disable=invalid-name
      _, query, _, item = self._route()
      if not item:
        return self._reply(501, self.path)
      key = (item.group(1), urllib.parse.unquote(item.group(2)))
      current = store.objects.get(key)
      if current is None or ("generation" in query and int(query["generation"][0]) != current[1]):
        return self._reply(404, key[1])
      data, generation = current
      if query.get("alt") == ["media"]:
        return self._reply(200, key[1], data, {"x-goog-generation": str(generation)})
      self._reply(200, key[1], json.dumps({"bucket": key[0], "name": key[1],
                                           "size": str(len(data)),
                                           "generation": str(generation)}).encode(),
                  {"Content-Type": "application/json"})

    def do_DELETE(self):  # pylint: disable=invalid-name
      _, query, _, item = self._route()
      if not item:
        return self._reply(501, self.path)
      key = (item.group(1), urllib.parse.unquote(item.group(2)))
      with store._guard:  # pylint: disable=protected-access
        if key not in store.objects:
          return self._reply(404, key[1])
        if not store.precondition(key, query):
          return self._reply(412, key[1])
        del store.objects[key]
      self._reply(204, key[1])

    def do_PUT(self):  # pylint: disable=invalid-name
      self._reply(501, self.path)

  return Handler


@contextlib.contextmanager
def serve():
  """A Store served on 127.0.0.1 (a free port) for the duration of the block."""
  store = Store()
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
  store.url = f"http://127.0.0.1:{server.server_address[1]}"
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield store
  finally:
    server.shutdown()
    server.server_close()
