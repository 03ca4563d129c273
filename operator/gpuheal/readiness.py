"""What keeps a process from doing its job, said once: the readiness answer and one log line
per change.

A misconfiguration (a bridge that refuses the token, a permission the ServiceAccount lacks, a
kernel log the agent cannot read) must not crash the process: a restart does not fix it, and a
crash loop hides the reason among tracebacks. The process stays up (liveness passes), its
readiness answers 503 with the reasons in the body, and each problem is logged once when it
appears or changes and once when it goes away. The server is stdlib only, in a thread of its
own: the operator's copy that waits for the Lease answers too, and so does the node agent.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/readyz"


class Readiness:
    """Problems by key (one per cause: ``bridge:default``, ``forbidden:nodes``, ``kernel-log``),
    each with the sentence a person needs to fix it."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._problems: dict[str, str] = {}
        self._lock = threading.Lock()

    def problem(self, key: str, message: str) -> bool:
        """Record ``message`` for ``key``; log it when it is new or changed. True then."""
        with self._lock:
            if self._problems.get(key) == message:
                return False
            self._problems[key] = message
        self.log.error("not ready: %s", message)
        return True

    def resolved(self, key: str) -> bool:
        """``key`` no longer stands in the way; log it once. True when it was a problem."""
        with self._lock:
            old = self._problems.pop(key, None)
        if old is None:
            return False
        self.log.warning("resolved: %s", old)
        return True

    def problems(self) -> dict[str, str]:
        with self._lock:
            return dict(self._problems)

    def answer(self) -> tuple[int, str]:
        """(HTTP status, body): 200 ``ready``, or 503 ``not ready: <reason>; <reason>``."""
        problems = self.problems()
        if not problems:
            return 200, "ready\n"
        return 503, "not ready: " + "; ".join(problems[k] for k in sorted(problems)) + "\n"

    def serve(self, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:  # noqa: S104 - the kubelet probes the pod's IP
        """Answer ``GET /readyz`` on ``port`` from a daemon thread; returns the server."""
        readiness = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = readiness.answer() if self.path == PATH else (404, "not found\n")
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a probe every few seconds is not worth a line

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="readyz", daemon=True).start()
        return server
