#!/usr/bin/env python3
"""Capture real Valkey replies into core/tests/fixtures/.

Starts real valkey-server processes (binary from scripts/valkey-bin.sh) on loopback
addresses with random high ports, drives them into the states the sidecar has to
understand (standalone primary/replica, link down, sync in progress, loading,
cluster ok/fail/failover, auth errors) and stores the exact replies.

Encoding of the fixtures:
  * bulk-string replies (INFO, CLUSTER INFO) are written verbatim (CRLF kept):
        <name>.info.txt, <name>.cluster-info.txt
  * every other reply is written as JSON, <name>.<command>.json, mapping RESP2 as
        +OK      -> {"status": "OK"}
        -ERR x   -> {"error": "ERR x"}
        :1       -> 1
        $3 abc   -> "abc"
        $-1/*-1  -> null
        *N       -> [...]

Python 3.11 standard library only. Every process started is killed and every
temporary directory is removed before the script exits.

Usage: scripts/capture-fixtures.py [--out DIR] [--bin PATH/TO/valkey-server]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "core" / "tests" / "fixtures"

INFO_SECTIONS = ("replication", "persistence", "server", "cluster")

# Sizes / delays used to make things slow enough to observe.
SYNC_KEYS = 200_000          # keys on the primary for the slow full sync
SYNC_SAVE_DELAY_US = 20      # rdb-key-save-delay on that primary (microseconds per key)
LOAD_KEYS = 200_000          # keys in the RDB loaded at startup
LOAD_DELAY_US = 20           # key-load-delay (microseconds per key) at startup
LOAD_EVENTS_BYTES = 1024     # loading-process-events-interval-bytes: serve clients often


def log(*a):
    print("[capture]", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Tiny RESP2 client
# ---------------------------------------------------------------------------

class Status(str):
    """RESP2 simple string (+...)."""


class Error(str):
    """RESP2 error (-...)."""


class ProtocolError(Exception):
    pass


class Conn:
    def __init__(self, host: str, port: int, timeout: float = 10.0):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rf = self.sock.makefile("rb")

    def close(self):
        try:
            self.rf.close()
        finally:
            self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def encode(args) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, int):
                a = str(a)
            if isinstance(a, str):
                a = a.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def send(self, *args):
        self.sock.sendall(self.encode(args))

    def read(self):
        line = self.rf.readline()
        if not line:
            raise ConnectionError("connection closed by server")
        if not line.endswith(b"\r\n"):
            raise ProtocolError(f"bad line {line!r}")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return Status(body.decode())
        if kind == b"-":
            return Error(body.decode())
        if kind == b":":
            return int(body)
        if kind == b"$":
            n = int(body)
            if n < 0:
                return None
            data = self.rf.read(n + 2)
            if len(data) != n + 2 or data[-2:] != b"\r\n":
                raise ProtocolError("short bulk string")
            return data[:-2]
        if kind == b"*":
            n = int(body)
            if n < 0:
                return None
            return [self.read() for _ in range(n)]
        raise ProtocolError(f"unexpected reply type {line!r}")

    def cmd(self, *args):
        self.send(*args)
        return self.read()

    def ok(self, *args):
        r = self.cmd(*args)
        if isinstance(r, Error):
            raise RuntimeError(f"{' '.join(map(str, args))} -> {r}")
        return r

    def info(self, *sections) -> dict:
        raw = self.ok("INFO", *sections)
        return parse_info(raw)


def parse_info(raw) -> dict:
    if isinstance(raw, bytes):
        raw = raw.decode()
    d = {}
    for line in raw.split("\r\n"):
        if line and not line.startswith("#") and ":" in line:
            k, v = line.split(":", 1)
            d[k] = v
    return d


def to_json(r):
    if isinstance(r, Status):
        return {"status": str(r)}
    if isinstance(r, Error):
        return {"error": str(r)}
    if isinstance(r, bytes):
        return r.decode("utf-8")
    if isinstance(r, list):
        return [to_json(x) for x in r]
    return r  # int or None


# ---------------------------------------------------------------------------
# Process / port management
# ---------------------------------------------------------------------------

class Lab:
    def __init__(self, binary: str):
        self.binary = binary
        self.tmp = tempfile.mkdtemp(prefix="valkey-fixtures-")
        self.procs: list[subprocess.Popen] = []
        self.used_ports: set[int] = set()
        self.counter = 0

    def free_port(self, host: str, cluster: bool = False) -> int:
        for _ in range(1000):
            port = random.randint(20000, 39999)
            if port in self.used_ports:
                continue
            cand = [port, port + 10000] if cluster else [port]
            try:
                for p in cand:
                    with socket.socket() as s:
                        s.bind((host, p))
            except OSError:
                continue
            self.used_ports.update(cand)
            return port
        raise RuntimeError("no free port")

    def new_dir(self, label: str) -> str:
        self.counter += 1
        d = os.path.join(self.tmp, f"{self.counter:02d}-{label}")
        os.makedirs(d)
        return d

    def start(self, label, host="127.0.0.1", port=None, dir=None, extra=(), cluster=False,
              wait=True):
        if port is None:
            port = self.free_port(host, cluster)
        if dir is None:
            dir = self.new_dir(label)
        args = [
            self.binary,
            "--bind", host, "--port", str(port),
            # outgoing replication / cluster-bus connections come from the node's own
            # loopback address (otherwise Linux picks 127.0.0.1 for 127.0.0.x peers)
            "--bind-source-addr", host,
            "--protected-mode", "no",
            "--save", "", "--appendonly", "no",
            "--enable-debug-command", "yes",
            "--repl-diskless-sync-delay", "0",
            "--dir", dir, "--daemonize", "no",
            "--logfile", os.path.join(dir, "valkey.log"),
        ]
        if cluster:
            args += ["--cluster-enabled", "yes",
                     "--cluster-config-file", os.path.join(dir, "nodes.conf"),
                     "--cluster-node-timeout", "2000"]
        args += list(extra)
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        node = Node(label, host, port, dir, p)
        log(f"started {label} pid={p.pid} at {host}:{port}")
        if wait:
            node.wait_ready()
        return node

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"pid {p.pid} did not exit")
        shutil.rmtree(self.tmp, ignore_errors=True)


class Node:
    def __init__(self, label, host, port, dir, proc):
        self.label, self.host, self.port, self.dir, self.proc = label, host, port, dir, proc
        self.id = None

    def conn(self, timeout=10.0) -> Conn:
        return Conn(self.host, self.port, timeout)

    def wait_ready(self, timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}; "
                                   f"see {self.dir}/valkey.log:\n{self.log_tail()}")
            try:
                with self.conn(2) as c:
                    if c.cmd("PING") == "PONG":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.label} not ready")

    def log_tail(self, n=30):
        try:
            with open(os.path.join(self.dir, "valkey.log")) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            log(f"killed {self.label} (pid {self.proc.pid})")

    def info(self, *sections) -> dict:
        with self.conn() as c:
            return c.info(*sections)

    def cmd(self, *args):
        with self.conn() as c:
            return c.cmd(*args)


def wait_for(what, pred, timeout=60.0, interval=0.1):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (OSError, ConnectionError) as e:
            last = e
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} (last={last!r})")


# ---------------------------------------------------------------------------
# Fixture writing
# ---------------------------------------------------------------------------

class Fixtures:
    def __init__(self, out: Path):
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        self.written: dict[str, str] = {}

    def text(self, filename, reply, desc, what=None):
        if not isinstance(reply, bytes):
            raise RuntimeError(f"{filename}: expected a bulk string, got {reply!r}")
        (self.out / filename).write_bytes(reply)
        self.written[filename] = (f"`{what}` reply; " if what else "") + desc
        log(f"wrote {filename} ({len(reply)} bytes)")

    def json(self, filename, reply, desc, what=None):
        data = json.dumps(to_json(reply), indent=2, ensure_ascii=False) + "\n"
        (self.out / filename).write_text(data)
        self.written[filename] = (f"`{what}` reply; " if what else "") + desc
        log(f"wrote {filename}: {json.dumps(to_json(reply))[:160]}")

    def capture(self, name, node_or_conn, desc, cluster=False):
        """INFO <sections> + ROLE (+ CLUSTER MYID/MYSHARDID/SHARDS/INFO/NODES in cluster mode)."""
        own = isinstance(node_or_conn, Node)
        c = node_or_conn.conn() if own else node_or_conn
        try:
            info_cmd = ("INFO",) + INFO_SECTIONS
            info = c.cmd(*info_cmd)
            if isinstance(info, bytes):
                self.text(f"{name}.info.txt", info, desc, " ".join(info_cmd))
            else:
                self.json(f"{name}.info.json", info, desc, " ".join(info_cmd))
            self.json(f"{name}.role.json", c.cmd("ROLE"), desc, "ROLE")
            if cluster:
                for sub in ("MYID", "MYSHARDID", "SHARDS"):
                    self.json(f"{name}.cluster-{sub.lower()}.json", c.cmd("CLUSTER", sub),
                              desc, f"CLUSTER {sub}")
                ci = c.cmd("CLUSTER", "INFO")
                if isinstance(ci, bytes):
                    self.text(f"{name}.cluster-info.txt", ci, desc, "CLUSTER INFO")
                else:
                    self.json(f"{name}.cluster-info.json", ci, desc, "CLUSTER INFO")
                self.text(f"{name}.cluster-nodes.txt", c.cmd("CLUSTER", "NODES"), desc,
                          "CLUSTER NODES")
            return parse_info(info) if isinstance(info, bytes) else {}
        finally:
            if own:
                c.close()


# ---------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------

def write_some(c: Conn, prefix: str, n: int = 500):
    for i in range(n):
        c.send("SET", f"{prefix}:{i}", f"value-{i}-" + "x" * (i % 50))
    c.send("INCRBY", f"{prefix}:counter", n)
    c.send("RPUSH", f"{prefix}:list", *[str(i) for i in range(20)])
    for _ in range(n + 2):
        r = c.read()
        if isinstance(r, Error):
            raise RuntimeError(f"write failed: {r}")


def replicas_caught_up(primary: Node, replicas: list[Node]):
    pi = primary.info("replication")
    off = int(pi["master_repl_offset"])
    if int(pi.get("connected_slaves", 0)) < len(replicas):
        return False
    for r in replicas:
        ri = r.info("replication")
        if ri.get("master_link_status") != "up" or int(ri.get("slave_repl_offset", -1)) != off:
            return False
    for i in range(len(replicas)):
        line = pi.get(f"slave{i}", "")
        if "state=online" not in line or f"offset={off}" not in line:
            return False
    return True


def scenario_standalone(lab: Lab, fx: Fixtures):
    primary = lab.start("primary")
    r1 = lab.start("replica1", extra=["--replicaof", primary.host, str(primary.port)])
    r2 = lab.start("replica2", extra=["--replicaof", primary.host, str(primary.port)])
    wait_for("replicas up", lambda: all(
        r.info("replication").get("master_link_status") == "up" for r in (r1, r2)))
    with primary.conn() as c:
        write_some(c, "pre", 1000)
    wait_for("replicas caught up", lambda: replicas_caught_up(primary, [r1, r2]))
    time.sleep(1.2)  # let a REPLCONF ACK round trip settle lag= values
    with primary.conn() as c:
        write_some(c, "post", 200)
    wait_for("replicas caught up again", lambda: replicas_caught_up(primary, [r1, r2]))

    fx.capture("standalone-primary", primary,
               "standalone primary with 2 online replicas after ~1200 SETs + INCRBY + RPUSH, "
               "replicas fully caught up")
    fx.capture("replica-link-up", r1,
               "replica (--replicaof) of standalone-primary, link up and caught up")

    primary.kill()
    wait_for("link down", lambda: r1.info("replication").get("master_link_status") == "down")
    time.sleep(1.1)  # master_link_down_since_seconds becomes >= 1
    fx.capture("replica-link-down", r1,
               "replica of standalone-primary ~1s after the primary was SIGKILLed "
               "(master_link_status:down; replica keeps retrying to connect)")
    r1.kill()
    r2.kill()


def scenario_sync_in_progress(lab: Lab, fx: Fixtures):
    primary = lab.start("sync-primary", extra=[
        "--repl-diskless-sync", "no",
        "--rdb-key-save-delay", str(SYNC_SAVE_DELAY_US),
    ])
    with primary.conn(120) as c:
        c.ok("DEBUG", "POPULATE", SYNC_KEYS, "key", 100)
    replica = lab.start("sync-replica")
    with replica.conn() as rc:
        rc.ok("REPLICAOF", primary.host, str(primary.port))
        t0 = time.time()
        seen = None
        while time.time() - t0 < 60:
            info = parse_info(rc.ok("INFO", "replication"))
            if info.get("master_sync_in_progress") == "1":
                seen = info
                # Wait until the handshake is done and the replica waits for the RDB
                # (ROLE state "sync"), so master_sync_* transfer fields are present.
                if "master_sync_total_bytes" in info:
                    break
            time.sleep(0.005)
        if not seen:
            raise RuntimeError("never saw master_sync_in_progress:1")
        time.sleep(0.3)
        info = fx.capture("replica-sync-in-progress", rc,
                          f"fresh replica right after REPLICAOF to a primary holding "
                          f"{SYNC_KEYS} keys (DEBUG POPULATE) with repl-diskless-sync no and "
                          f"rdb-key-save-delay {SYNC_SAVE_DELAY_US}: the primary is still "
                          f"writing the RDB so master_sync_in_progress:1")
        if info.get("master_sync_in_progress") != "1":
            raise RuntimeError("sync finished before capture; increase delays")
    fx.capture("primary-sync-in-progress", primary,
               "the primary of replica-sync-in-progress at the same moment "
               "(BGSAVE for the replica in progress)")
    replica.kill()
    primary.kill()


def scenario_sync_diskless(lab: Lab, fx: Fixtures):
    """Same as above but diskless: the replica is receiving the RDB stream."""
    primary = lab.start("sync-primary-diskless", extra=[
        "--repl-diskless-sync", "yes",
        "--rdb-key-save-delay", str(SYNC_SAVE_DELAY_US),
    ])
    with primary.conn(120) as c:
        c.ok("DEBUG", "POPULATE", SYNC_KEYS, "key", 100)
    replica = lab.start("sync-replica-diskless")
    with replica.conn() as rc:
        rc.ok("REPLICAOF", primary.host, str(primary.port))

        def reading():
            info = parse_info(rc.ok("INFO", "replication"))
            return (info.get("master_sync_in_progress") == "1"
                    and int(info.get("master_sync_read_bytes", "0")) > 0)
        wait_for("diskless transfer", reading, timeout=60, interval=0.01)
        time.sleep(0.5)
        info = fx.capture("replica-sync-in-progress-diskless", rc,
                          f"like replica-sync-in-progress but repl-diskless-sync yes: the "
                          f"replica is receiving the RDB stream (rdb-key-save-delay "
                          f"{SYNC_SAVE_DELAY_US} on the primary keeps it slow)")
        if info.get("master_sync_in_progress") != "1":
            raise RuntimeError("diskless sync finished before capture")
    replica.kill()
    primary.kill()


def start_loading(lab: Lab, label: str):
    """Create an RDB, restart on it slowly, return (node, conn) while loading:1."""
    node = lab.start(label + "-seed")
    with node.conn(300) as c:
        c.ok("DEBUG", "POPULATE", LOAD_KEYS, "key", 100)
        c.ok("SAVE")
    node.kill()
    node2 = lab.start(label, host=node.host, port=node.port, dir=node.dir, extra=[
        "--dbfilename", "dump.rdb",
        "--key-load-delay", str(LOAD_DELAY_US),
        "--loading-process-events-interval-bytes", str(LOAD_EVENTS_BYTES),
    ], wait=False)
    return node2, wait_loading(node2)


def scenario_loading(lab: Lab, fx: Fixtures):
    node, c = start_loading(lab, "loading")
    with c:
        time.sleep(0.5)  # some progress, so loading_loaded_* fields are non-zero
        desc = (f"standalone server restarted on a dump.rdb of {LOAD_KEYS} keys with "
                f"--key-load-delay {LOAD_DELAY_US} --loading-process-events-interval-bytes "
                f"{LOAD_EVENTS_BYTES}, captured while loading:1")
        info = fx.capture("loading", c, desc)
        fx.json("loading.ping.json", c.cmd("PING"), desc, "PING")
        if info.get("loading") != "1":
            raise RuntimeError("loading finished before capture")
    node.kill()


def scenario_auth(lab: Lab, fx: Fixtures):
    node = lab.start("auth", extra=["--requirepass", "s3cret-pass"], wait=False)
    wait_for("auth server", lambda: node.cmd("PING") is not None, timeout=30)
    with node.conn() as c:
        fx.json("noauth.error.json", c.cmd("INFO", *INFO_SECTIONS),
                "server with --requirepass, command sent without AUTH (PING and ROLE get the "
                "same error)", "INFO " + " ".join(INFO_SECTIONS))
        ping = c.cmd("PING")
        role = c.cmd("ROLE")
        log(f"noauth PING -> {ping!r}, ROLE -> {role!r}")
        fx.json("auth-wrong.error.json", c.cmd("AUTH", "wrong-password"),
                "server with --requirepass, wrong password", "AUTH <password>")
        fx.json("auth-wrong-user.error.json", c.cmd("AUTH", "default", "wrong-password"),
                "server with --requirepass, wrong password", "AUTH default <password>")
        fx.json("auth-ok.json", c.cmd("AUTH", "s3cret-pass"),
                "server with --requirepass, right password", "AUTH <password>")
    node.kill()


def scenario_debug_sleep(lab: Lab) -> str:
    node = lab.start("debug-sleep")
    with node.conn() as c1, node.conn() as c2:
        c1.send("DEBUG", "SLEEP", "2")
        time.sleep(0.1)
        t0 = time.time()
        r = c2.cmd("PING")
        dt = time.time() - t0
        r1 = c1.read()
    node.kill()
    msg = (f"PING from a second connection during DEBUG SLEEP 2 returned {r!r} after "
           f"{dt:.2f}s (DEBUG SLEEP reply {r1!r}) -> "
           f"{'BLOCKED' if dt > 1.5 else 'did NOT block'}")
    log(msg)
    return msg


# --- cluster ---------------------------------------------------------------

def crc16(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    k = key.encode()
    s = k.find(b"{")
    if s != -1:
        e = k.find(b"}", s + 1)
        if e != -1 and e != s + 1:
            k = k[s + 1:e]
    return crc16(k) % 16384


def cluster_ok(n: Node) -> bool:
    return parse_info(n.cmd("CLUSTER", "INFO")).get("cluster_state") == "ok"


def all_online_in_shards(n: Node, expect_nodes: int) -> bool:
    shards = n.cmd("CLUSTER", "SHARDS")
    count = 0
    for sh in shards:
        d = dict(zip(sh[::2], sh[1::2]))
        for node in d[b"nodes"]:
            nd = dict(zip(node[::2], node[1::2]))
            if nd.get(b"health") != b"online":
                return False
            count += 1
    return count == expect_nodes


def node_flags(n: Node) -> dict:
    """node id -> set of CLUSTER NODES flags, as seen by n."""
    out = {}
    for line in n.cmd("CLUSTER", "NODES").decode().splitlines():
        f = line.split()
        out[f[0]] = set(f[2].split(","))
    return out


def cluster_replica_loading(lab: Lab, fx: Fixtures, primary: Node, replica: Node,
                            zone: str, slot_range) -> Node:
    """Restart `replica` on a big RDB with key-load-delay; capture it (and its primary) while
    it is loading; then bring it back without delay. Returns the new Node."""
    lo, hi = slot_range
    tag = next(f"t{i}" for i in range(10000) if lo <= key_slot(f"{{t{i}}}") <= hi)
    # DEBUG POPULATE is not propagated to replicas: run it on both (same deterministic
    # keys and values), so primary and replica hold the same dataset.
    for n in (primary, replica):
        with n.conn(300) as c:
            c.ok("DEBUG", "POPULATE", LOAD_KEYS, f"{{{tag}}}key", 100)
    with replica.conn(300) as c:
        if c.ok("DBSIZE") < LOAD_KEYS:
            raise RuntimeError("DEBUG POPULATE on the replica did not create the keys")
        c.ok("SAVE")
    replica.kill()
    slow = lab.start(replica.label + "-loading", host=replica.host, port=replica.port,
                     dir=replica.dir, cluster=True, wait=False, extra=[
                         "--availability-zone", zone,
                         "--key-load-delay", str(LOAD_DELAY_US),
                         "--loading-process-events-interval-bytes", str(LOAD_EVENTS_BYTES)])
    c = wait_loading(slow)
    with c:
        time.sleep(0.5)
        desc = (f"replica of shard 0 (zone-b) in the healthy cluster, restarted on its own "
                f"dump.rdb ({LOAD_KEYS} keys from DEBUG POPULATE with a hash tag of shard 0, "
                f"run on primary and replica) with --key-load-delay {LOAD_DELAY_US} "
                f"--loading-process-events-interval-bytes {LOAD_EVENTS_BYTES}; captured "
                f"~0.5s into loading (loading:1)")
        info = fx.capture("cluster-replica-loading", c, desc, cluster=True)
        fx.json("cluster-replica-loading.ping.json", c.cmd("PING"), desc, "PING")
        if info.get("loading") != "1":
            raise RuntimeError("cluster replica loading finished before capture")
        # the primary's view, after more than cluster-node-timeout
        time.sleep(3)
        fx.capture("cluster-primary-replica-loading", primary,
                   "primary of shard 0 ~3.5s after its replica (cluster-replica-loading) "
                   "was restarted and is still loading (> cluster-node-timeout 2000)",
                   cluster=True)
        still = parse_info(c.ok("INFO", "persistence")).get("loading")
        if still != "1":
            raise RuntimeError("replica finished loading before the primary view was captured")
    slow.kill()
    back = lab.start(replica.label, host=replica.host, port=replica.port, dir=replica.dir,
                     cluster=True, extra=["--availability-zone", zone], wait=False)
    wait_for("replica restarted", lambda: back.info("persistence").get("loading") == "0",
             timeout=120, interval=0.2)
    back.id = replica.id
    return back


def wait_loading(node: Node, timeout=30.0) -> Conn:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            conn = node.conn()
            r = conn.cmd("INFO", "persistence")
            if isinstance(r, bytes) and parse_info(r).get("loading") == "1":
                return conn
            conn.close()
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"{node.label}: never saw loading:1\n{node.log_tail()}")


def scenario_cluster(lab: Lab, fx: Fixtures):
    # shard i: primary on 127.0.0.(2+i), replica on 127.0.0.(5+i)
    zones_primary = ["zone-a", "zone-b", "zone-c"]
    zones_replica = ["zone-b", "zone-c", "zone-a"]
    ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
    primaries, replicas = [], []
    for i in range(3):
        primaries.append(lab.start(f"cluster-p{i}", host=f"127.0.0.{2 + i}", cluster=True))
    for i in range(3):
        replicas.append(lab.start(f"cluster-r{i}", host=f"127.0.0.{5 + i}", cluster=True))
    nodes = primaries + replicas
    for i, n in enumerate(primaries):
        n.cmd("CONFIG", "SET", "availability-zone", zones_primary[i])
    for i, n in enumerate(replicas):
        n.cmd("CONFIG", "SET", "availability-zone", zones_replica[i])
    for n in nodes:
        n.id = n.cmd("CLUSTER", "MYID").decode()
    for n, (lo, hi) in zip(primaries, ranges):
        with n.conn() as c:
            c.ok("CLUSTER", "ADDSLOTSRANGE", lo, hi)
    for n in nodes[1:]:
        with n.conn() as c:
            c.ok("CLUSTER", "MEET", nodes[0].host, nodes[0].port)

    def everyone_knows_everyone():
        for n in nodes:
            lines = n.cmd("CLUSTER", "NODES").decode().strip().splitlines()
            if len(lines) != 6 or any("handshake" in l or "noaddr" in l for l in lines):
                return False
        return True
    wait_for("all nodes met", everyone_knows_everyone, timeout=60, interval=0.2)
    for p, r in zip(primaries, replicas):
        with r.conn() as c:
            c.ok("CLUSTER", "REPLICATE", p.id)
    wait_for("cluster ok everywhere", lambda: all(cluster_ok(n) for n in nodes), timeout=60,
             interval=0.2)
    wait_for("replicas link up", lambda: all(
        r.info("replication").get("master_link_status") == "up" for r in replicas), timeout=60)

    # Some writes on every shard, routed by slot.
    conns = [p.conn() for p in primaries]
    try:
        for i in range(600):
            key = f"user:{i}"
            slot = key_slot(key)
            shard = next(j for j, (lo, hi) in enumerate(ranges) if lo <= slot <= hi)
            r = conns[shard].cmd("SET", key, "v" * (10 + i % 40))
            if isinstance(r, Error):
                raise RuntimeError(f"SET {key} -> {r}")
    finally:
        for c in conns:
            c.close()
    wait_for("cluster replicas caught up",
             lambda: all(replicas_caught_up(p, [r]) for p, r in zip(primaries, replicas)),
             timeout=60)
    wait_for("all nodes online in CLUSTER SHARDS",
             lambda: all(all_online_in_shards(n, 6) for n in nodes), timeout=60, interval=0.2)

    fx.capture("cluster-primary", primaries[0],
               "primary of shard 0 (slots 0-5460, zone-a) in a healthy 3 shard x 1 replica "
               "cluster, nodes on 127.0.0.2-7, ~600 keys written", cluster=True)
    fx.capture("cluster-replica", replicas[0],
               "replica of shard 0 (zone-b) in the same healthy cluster", cluster=True)

    replicas[0] = cluster_replica_loading(lab, fx, primaries[0], replicas[0],
                                          zones_replica[0], ranges[0])
    nodes = primaries + replicas
    wait_for("cluster healthy again", lambda: (
        all(cluster_ok(n) for n in nodes)
        and replicas_caught_up(primaries[0], [replicas[0]])
        and all(all_online_in_shards(n, 6) for n in nodes)), timeout=120, interval=0.2)

    # Manual failover in shard 1.
    old, new = primaries[1], replicas[1]
    with new.conn() as c:
        c.ok("CLUSTER", "FAILOVER")

    def failed_over():
        return (new.info("replication").get("role") == "master"
                and old.info("replication").get("role") == "slave"
                and old.info("replication").get("master_link_status") == "up"
                and all(cluster_ok(n) for n in nodes))
    wait_for("manual failover", failed_over, timeout=60, interval=0.2)
    wait_for("all nodes online after failover",
             lambda: all(all_online_in_shards(n, 6) for n in nodes), timeout=60, interval=0.2)
    wait_for("demoted replica caught up", lambda: replicas_caught_up(new, [old]), timeout=60)
    fx.capture("cluster-promoted", new,
               "former replica of shard 1 (zone-c) after CLUSTER FAILOVER was sent to it: "
               "now the primary", cluster=True)
    fx.capture("cluster-demoted", old,
               "former primary of shard 1 (zone-b) after the manual failover: now a replica "
               "of cluster-promoted", cluster=True)

    # Kill shard 2 entirely -> cluster_state:fail.
    primaries[2].kill()
    replicas[2].kill()
    observer = primaries[0]
    wait_for("cluster_state:fail", lambda: not cluster_ok(observer), timeout=60, interval=0.2)

    def both_marked_failed():
        flags = node_flags(observer)
        return all("fail" in flags.get(n.id, ()) for n in (primaries[2], replicas[2]))
    wait_for("dead nodes marked fail", both_marked_failed, timeout=60, interval=0.2)
    fx.capture("cluster-fail", observer,
               "primary of shard 0 after both nodes of shard 2 (primary and replica) were "
               "SIGKILLed and marked FAIL (cluster_state:fail)", cluster=True)
    fx.capture("cluster-fail-replica", replicas[0],
               "replica of shard 0 in the same failed cluster", cluster=True)
    for n in nodes:
        n.kill()


# ---------------------------------------------------------------------------

def write_readme(fx: Fixtures, version: str, notes: list[str]):
    order = sorted(fx.written)
    lines = [
        "# Valkey reply fixtures",
        "",
        f"Captured from a real `valkey-server` {version} on "
        f"{datetime.date.today().isoformat()} by `scripts/capture-fixtures.py` "
        "(re-run it to regenerate; it starts and kills its own servers on loopback).",
        "",
        "Encoding: `*.info.txt` / `*.cluster-info.txt` are the bulk-string replies byte for "
        "byte (CRLF line endings kept). `*.json` are other RESP2 replies: simple string -> "
        '`{"status": "..."}`, error -> `{"error": "..."}`, integer -> number, bulk string -> '
        "string, null -> `null`, array -> array.",
        "",
        f"INFO fixtures are the reply to one `INFO {' '.join(INFO_SECTIONS)}` call. "
        "Cluster fixtures also hold `CLUSTER MYID`, `CLUSTER MYSHARDID`, `CLUSTER SHARDS`, "
        "`CLUSTER INFO` and `CLUSTER NODES`.",
        "",
        "## Files",
        "",
    ]
    for f in order:
        lines.append(f"- `{f}`: {fx.written[f]}")
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- {n}" for n in notes]
    (fx.out / "README.md").write_text("\n".join(lines) + "\n")
    log("wrote README.md")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--bin", help="valkey-server binary (default: scripts/valkey-bin.sh)")
    ap.add_argument("--only", nargs="*", help="run only these scenarios (debugging)")
    args = ap.parse_args()
    binary = args.bin or subprocess.run(
        [str(REPO / "scripts" / "valkey-bin.sh")], check=True, capture_output=True,
        text=True).stdout.strip()
    version = subprocess.run([binary, "--version"], check=True, capture_output=True,
                             text=True).stdout.strip()
    log(version)

    lab = Lab(binary)
    fx = Fixtures(args.out)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    scenarios = {
        "standalone": scenario_standalone,
        "sync": scenario_sync_in_progress,
        "sync-diskless": scenario_sync_diskless,
        "loading": scenario_loading,
        "auth": scenario_auth,
        "debug-sleep": lambda lab, fx: notes.append(scenario_debug_sleep(lab)),
        "cluster": scenario_cluster,
    }
    notes = []
    try:
        for name, fn in scenarios.items():
            if args.only and name not in args.only:
                continue
            log(f"=== {name}")
            fn(lab, fx)
    finally:
        lab.cleanup()
    if args.only:
        return  # partial run: keep the existing README
    notes[:0] = [
        f"Server: `{version}`.",
        "Every server ran on loopback with `--save '' --appendonly no --enable-debug-command yes "
        "--repl-diskless-sync-delay 0 --protected-mode no --bind <ip> --bind-source-addr <ip>` "
        "and its own `--dir`; cluster nodes also `--cluster-enabled yes --cluster-node-timeout "
        "2000`, built by hand (CONFIG SET availability-zone, CLUSTER ADDSLOTSRANGE, CLUSTER MEET, "
        "CLUSTER REPLICATE) on 127.0.0.2-7. Ports, node/shard ids, run ids, replids and "
        "timestamps differ on every run.",
        f"Slow full sync: primary with `repl-diskless-sync no` (or `yes` for the -diskless "
        f"variant) and `rdb-key-save-delay {SYNC_SAVE_DELAY_US}` (microseconds slept per key "
        f"while producing the RDB), {SYNC_KEYS} keys from `DEBUG POPULATE {SYNC_KEYS} key 100`.",
        f"Slow loading: `key-load-delay {LOAD_DELAY_US}` (microseconds per key loaded) plus "
        f"`loading-process-events-interval-bytes {LOAD_EVENTS_BYTES}` so the loading server "
        f"serves clients often enough to be polled; RDB from `DEBUG POPULATE {LOAD_KEYS} ...` + "
        f"`SAVE`.",
        "INFO answers the requested sections in the server's own order (Server, Persistence, "
        "Replication, Cluster), not in the order asked.",
        "`DEBUG POPULATE` is not propagated to replicas.",
    ]
    short = next((w[2:] for w in version.split() if w.startswith("v=")), version)
    write_readme(fx, short, notes)


if __name__ == "__main__":
    main()
