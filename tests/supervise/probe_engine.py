# SPDX-License-Identifier: Apache-2.0
"""A stand-in engine process for the supervisor tests: serves /startup and
/live like the engine's probe server and misbehaves on request.

  probe_engine.py PORT [--live-fail] [--ignore-term] [--crash-runs N COUNTER_FILE]
                       [--crash-code CODE] [--exit CODE] [--start-delay SEC]
                       [--fds FILE] [--detached JSON_ARGV OUT_FILE]

--fds writes the file descriptors it was started with (fd: target) as JSON;
--detached starts JSON_ARGV as its child in a session of its own (out of
the process group the supervisor kills), its output into OUT_FILE and its
pid (the session's) into OUT_FILE.pid.
"""
import argparse
import http.server
import json
import os
import subprocess
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("port", type=int)
ap.add_argument("--live-fail", action="store_true")
ap.add_argument("--ignore-term", action="store_true")
ap.add_argument("--crash-runs", nargs=2, metavar=("N", "COUNTER"))
ap.add_argument("--crash-code", type=int, default=1, help="exit status of the --crash-runs runs")
ap.add_argument("--exit", type=int)
ap.add_argument("--start-delay", type=float, default=0.0)
ap.add_argument("--fds")
ap.add_argument("--detached", nargs=2, metavar=("JSON_ARGV", "OUT_FILE"))
a = ap.parse_args()

if a.fds:
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the directory listing's own fd, closed by now
    with open(a.fds + ".tmp", "w") as f:
        json.dump(fds, f)
    os.rename(a.fds + ".tmp", a.fds)
if a.detached:
    with open(a.detached[1], "w") as out:
        child = subprocess.Popen(json.loads(a.detached[0]), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    with open(a.detached[1] + ".pid", "w") as f:
        f.write(str(child.pid))

if a.exit is not None:
    sys.exit(a.exit)
if a.crash_runs:
    n, path = int(a.crash_runs[0]), a.crash_runs[1]
    runs = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(runs + 1))
    if runs < n:
        sys.exit(a.crash_code)
if a.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(a.start_delay)


class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/startup" or (self.path == "/live" and not a.live_fail)
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", a.port), H).serve_forever()
