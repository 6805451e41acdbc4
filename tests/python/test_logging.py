# SPDX-License-Identifier: Apache-2.0
"""Logs: the library's lines into Python's logging module
(gf.log_to_logging()), journald priorities for a daemon whose stderr is the
journal's stream (JOURNAL_STREAM), and GF_LOG's level honoured by the
daemons' hook."""
import logging
import os
import re
import subprocess
import time

from conftest import GMSD, LOCKD, gf, load_one_tensor, wait_for


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def run_engine(cluster):
    eng = gf.Engine(cluster.lock_uri, "logged", [cluster.gms_uri()], backend="host")
    eng.init_weights(load=load_one_tensor)
    eng.sleep()
    eng.acquire(timeout=10)
    eng.wake_up()
    eng.serve()
    return eng


def test_library_lines_reach_the_logging_module(cluster):
    cluster.lockd()
    cluster.gmsd()
    handler = Collect()
    base = logging.getLogger("gftest")
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    base.propagate = False
    before = time.time()
    gf.log_to_logging("gftest")
    try:
        eng = run_engine(cluster)
        wait_for(lambda: any("to=active" in r.getMessage() for r in handler.records), what="the Active line")
        eng.close()
    finally:
        gf.log_to_logging(None)
    after = time.time()
    recs = [r for r in handler.records if r.name == "gftest.engine"]
    assert recs, [r.name for r in handler.records]
    for r in recs:
        assert r.levelno == logging.INFO and r.gf_component == "engine" and r.gf_mono_us > 0
        assert before - 1 <= r.created <= after + 1
        assert re.match(r"event=\w+", r.getMessage()), r.getMessage()
    # Removed: nothing more arrives.
    n = len(handler.records)
    eng2 = gf.Engine(cluster.lock_uri, "quiet", [cluster.gms_uri()], backend="host")
    eng2.close()
    gf._gpufailover._drain_log()
    assert len(handler.records) == n


def test_level_filters_in_the_library(cluster):
    cluster.lockd()
    cluster.gmsd()
    handler = Collect()
    base = logging.getLogger("gftest2")
    base.addHandler(handler)
    base.propagate = False
    gf.log_to_logging("gftest2", level=logging.WARNING)
    try:
        run_engine(cluster).close()
        gf._gpufailover._drain_log()
    finally:
        gf.log_to_logging(None)
    assert not [r for r in handler.records if r.levelno < logging.WARNING]


def start_lockd(tmp, env):
    """gf-lockd with stderr in a file; its log text after one grant and release."""
    log = tmp / "lockd.log"
    with open(log, "wb") as out:
        st = os.fstat(out.fileno())
        env = dict(os.environ, **{k: v.format(dev=st.st_dev, ino=st.st_ino) for k, v in env.items()})
        p = subprocess.Popen([LOCKD, f"--listen=unix://{tmp}/l.sock", f"--state-file={tmp}/l.state"], stderr=out,
                             env=env)
    try:
        wait_for(lambda: gf.lock_status(f"unix://{tmp}/l.sock", 0.2), what="gf-lockd")
        c = gf.LockClient(f"unix://{tmp}/l.sock", "logged")
        c.acquire(timeout=10)
        c.release()
        c.close()
    finally:
        p.terminate()
        p.wait(timeout=30)
    return log.read_text()


def test_journald_priority_prefix_under_journal_stream(tmp_path):
    text = start_lockd(tmp_path, {"JOURNAL_STREAM": "{dev}:{ino}", "GF_LOG": "info"})
    lines = text.splitlines()
    assert lines and all(re.match(r"<[3467]>ts=", l) for l in lines), text
    assert any(l.startswith("<6>") and "level=info" in l for l in lines), text


def test_no_prefix_when_stderr_is_not_the_journal(tmp_path):
    text = start_lockd(tmp_path, {"JOURNAL_STREAM": "1:2", "GF_LOG": "info"})
    assert text and all(l.startswith("ts=") for l in text.splitlines()), text


def test_gf_log_sets_a_daemons_level(tmp_path):
    """The library's lines follow GF_LOG (the daemon's own start and stop
    lines are written whatever it says: scripts wait for them)."""
    granted = re.compile(r"level=info component=lock .*id=logged")
    assert granted.search(start_lockd(tmp_path, {"GF_LOG": "info"}))
    assert not granted.search(start_lockd(tmp_path, {"GF_LOG": "warn"}))


def logfmt(line):
    """A logfmt parser (the format of Heroku's and Go's logfmt): key=value
    pairs, a value bare or in double quotes with backslash escapes."""
    pairs, i, n = {}, 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        j = i
        while j < n and line[j] not in "= ":
            j += 1
        key = line[i:j]
        if j >= n or line[j] != "=":
            pairs[key], i = True, j
            continue
        j += 1
        if j < n and line[j] == '"':
            j, out = j + 1, []
            while j < n and line[j] != '"':
                if line[j] == "\\" and j + 1 < n:
                    j += 1
                    out.append({"n": "\n", "t": "\t", "r": "\r"}.get(line[j], line[j]))
                else:
                    out.append(line[j])
                j += 1
            assert j < n, f"unterminated value in {line!r}"
            pairs[key], i = "".join(out), j + 1
        else:
            k = j
            while k < n and line[k] != " ":
                k += 1
            pairs[key], i = line[j:k], k
    return pairs


def test_a_value_with_a_space_and_a_quote_round_trips(tmp_path):
    d = tmp_path / 'a dir "quoted" = here'
    d.mkdir()
    state = d / "lock.state"
    out = tmp_path / "err.log"
    with open(out, "wb") as err:
        p = subprocess.Popen([LOCKD, f"--listen=unix://{tmp_path}/l.sock", f"--state-file={state}"], stderr=err,
                             env=dict(os.environ, GF_LOG="info"))
    try:
        wait_for(lambda: gf.lock_status(f"unix://{tmp_path}/l.sock", 0.2), what="gf-lockd")
    finally:
        p.terminate()
        p.wait(timeout=30)
    lines = out.read_text().splitlines()
    (line,) = [l for l in lines if "state file missing" in l]
    kv = logfmt(line)
    assert kv["path"] == str(state), line
    assert kv["error"] == f"open {state}: No such file or directory", line
    assert kv["level"] == "error" and kv["component"] == "lock" and kv["event"] == "state_file"
    assert kv["msg"].startswith("state file missing;")
    for l in lines:  # the server's own lines too (ready, stopping)
        assert "event" in logfmt(l), l


def test_python_engines_write_the_same_format(capfd):
    gf.log_event("python-engine", "weights_loaded", path='/m/a b"c', n=3, ok=True)
    line = capfd.readouterr().err.strip()
    kv = logfmt(line)
    assert (kv["prog"], kv["level"], kv["component"], kv["event"]) == ("python-engine", "info", "python-engine",
                                                                       "weights_loaded")
    assert kv["path"] == '/m/a b"c' and kv["n"] == "3" and kv["ok"] == "True"
    assert re.match(r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z mono_us=\d+ ", line), line
    assert gf.logfmt_value("plain") == "plain" and gf.logfmt_value("") == '""'
    tricky = "a=b \\ c"
    assert logfmt("k=" + gf.logfmt_value(tricky))["k"] == tricky
