"""A per-user background worker that keeps the kernels loaded between `stereo match` runs.

A process that starts, imports numba and loads its compiled kernels spends most of its
time there (0.6 s of 0.75 on 2 cores for a small pair; a CUDA context costs a second
more), so a shell loop of one `stereo match` per pair waits on start-up. After a
`stereo match` on a warm kernel cache, the command starts this worker in the
background; later `stereo match` commands hand it their arguments and current folder
over a Unix socket and print what it sends back. The worker runs exactly the same
command (`cli.main`) in its own process, so the output files and the bytes on stdout
and stderr are the same as in-process.

Trust and safety:
  * the socket lives in a folder only this user can enter ($STEREOCLI_RUNTIME_DIR,
    else $XDG_RUNTIME_DIR/stereocli, else /tmp/stereocli-UID, mode 0700, checked to be
    the user's own); nothing listens on the network;
  * a worker serves one install and one environment: the socket's name hashes the
    Python, stereocli's files and the variables that change results or devices
    (NUMBA_*, CUDA_*, STEREOCLI_*, OPENCV_*), so an upgrade or another setting never
    talks to an old worker;
  * a command falls back to running in-process whenever the worker is absent, busy
    (no answer within READY_WAIT_S), or breaks mid-way (outputs are written whole or not
    at all, so nothing is half-written; the in-process run writes them again);
  * `--no-worker` or STEREOCLI_NO_WORKER=1 turn it off; `stereo info` shows its state,
    `stereo info --stop-worker` stops it; it exits by itself after IDLE_S idle seconds
    (STEREOCLI_WORKER_IDLE).
Commands that read standard input ('-' as LEFT or RIGHT) always run in-process.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

READY_WAIT_S = 0.25  # a busy worker is not waited for longer than this
IDLE_S = float(os.environ.get("STEREOCLI_WORKER_IDLE", "600"))
_ENV_PREFIXES = ("NUMBA_", "CUDA_", "STEREOCLI_", "OPENCV_", "OMP_", "XDG_CACHE_HOME")
_READY = b"R"


# ----------------------------------------------------------------------------- where

def runtime_dir() -> Path | None:
    """The user's private folder for the socket, created 0700; None if it is not safe."""
    base = os.environ.get("STEREOCLI_RUNTIME_DIR")
    if base:
        d = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        d = Path(os.environ["XDG_RUNTIME_DIR"]) / "stereocli"
    else:
        d = Path("/tmp") / f"stereocli-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # someone else's, or open to others: do not use it
    return d


def _key() -> str:
    here = Path(__file__).resolve().parent
    parts = [sys.executable, str(here)]
    for f in sorted(here.rglob("*.py")):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_mtime_ns}:{st.st_size}")
    parts += [f"{k}={v}" for k, v in sorted(os.environ.items())
              if k.startswith(_ENV_PREFIXES) and k != "STEREOCLI_NO_WORKER"]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def paths() -> tuple[Path, Path] | None:
    """(socket, lock file) of this install and environment's worker, or None if unsafe."""
    d = runtime_dir()
    if d is None:
        return None
    k = _key()
    return d / f"worker-{k}.sock", d / f"worker-{k}.lock"


def enabled(argv: list[str]) -> bool:
    """Whether this command line may be handed to the worker."""
    if os.environ.get("STEREOCLI_NO_WORKER", "0") not in ("", "0") or sys.platform == "win32":
        return False
    if not argv or argv[0] != "match" or "--no-worker" in argv or "--help" in argv or "-h" in argv:
        return False
    for i, a in enumerate(argv):  # '-' reads standard input, except as -o's value (stdout, forwarded)
        if a == "-" and argv[i - 1] not in ("-o", "--output"):
            return False
    return True


# ----------------------------------------------------------------------------- wire

def _send(sock, data: bytes) -> None:
    sock.sendall(struct.pack(">Q", len(data)) + data)


def _recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        buf += chunk
    return bytes(buf)


def _recv(sock) -> bytes:
    (n,) = struct.unpack(">Q", _recv_exact(sock, 8))
    return _recv_exact(sock, n)


# ----------------------------------------------------------------------------- client

def try_run(argv: list[str]) -> int | None:
    """Run `stereo ARGV` in the worker and print its output; None if it could not (then
    the caller runs the command itself)."""
    where = paths()
    if where is None or not where[0].exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(READY_WAIT_S)
        sock.connect(str(where[0]))
        if sock.recv(1) != _READY:
            return None
        sock.settimeout(None)
        umask = os.umask(0)
        os.umask(umask)
        _send(sock, json.dumps({"argv": argv, "cwd": os.getcwd(), "umask": umask}).encode())
        head = json.loads(_recv(sock))
        if head.get("fallback"):
            return None
        out, err = _recv(sock), _recv(sock)
    except (OSError, ValueError, ConnectionError):
        return None  # absent, busy or broken: run in-process
    finally:
        sock.close()
    sys.stdout.flush()
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()
    sys.stderr.flush()
    sys.stderr.buffer.write(err)
    sys.stderr.buffer.flush()
    return int(head["code"])


def start() -> None:
    """Start a worker in the background (it exits at once if one already runs)."""
    import subprocess
    try:
        subprocess.Popen([sys.executable, "-m", "stereocli.worker"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True, cwd="/")
    except OSError:
        pass


def status() -> str:
    """One line for `stereo info`."""
    if os.environ.get("STEREOCLI_NO_WORKER", "0") not in ("", "0"):
        return "off (STEREOCLI_NO_WORKER)"
    where = paths()
    if where is None:
        return "off (no private runtime folder for its socket)"
    info = _read_state(where[1])
    if info and where[0].exists() and _alive(info.get("pid")):
        return (f"running, pid {info['pid']}, {info.get('served', 0)} commands served, socket {where[0]} "
                f"(stops after {IDLE_S:.0f} s idle; STEREOCLI_NO_WORKER=1 turns it off)")
    return f"not running (the next stereo match starts it; socket {where[0]})"


def stop() -> bool:
    """Stop this install's worker; True if one was running."""
    import signal
    where = paths()
    info = _read_state(where[1]) if where else None
    if info and _alive(info.get("pid")):
        os.kill(info["pid"], signal.SIGTERM)
        return True
    return False


def _read_state(lock: Path) -> dict | None:
    try:
        return json.loads(lock.read_text() or "null")
    except (OSError, ValueError):
        return None


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- server

def serve() -> None:
    """The worker: hold the lock, load the kernels, answer commands until idle."""
    import fcntl
    import signal
    where = paths()
    if where is None:
        return
    sock_path, lock_path = where
    lock = open(lock_path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another worker serves this install
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    from . import cli  # noqa: F401  (imports numba, cv2 and the stages)
    _warm()
    try:
        sock_path.unlink()
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    server.bind(str(sock_path))
    os.umask(old)
    server.listen(16)
    server.settimeout(IDLE_S)
    state = {"pid": os.getpid(), "started": time.time(), "served": 0}
    _write_state(lock, state)
    try:
        while True:
            try:
                conn, _ = server.accept()
            except socket.timeout:
                return  # idle: exit, the next command starts a new worker
            with conn:
                if _serve_one(conn):
                    state["served"] += 1
                    _write_state(lock, state)
    finally:
        try:
            if sock_path.exists():
                sock_path.unlink()
        except OSError:
            pass
        _write_state(lock, None)


def _warm() -> None:
    """Load the default pipeline's kernels (and a CUDA context when a GPU is usable)."""
    import numpy as np

    from . import config, pipeline
    from .backends import cuda_status, get_backend
    rng = np.random.default_rng(0)
    left = rng.integers(0, 256, (32, 96), dtype=np.uint8)
    for device in ("cpu", "cuda") if cuda_status()[0] else ("cpu",):
        try:
            pipeline.run(left, np.roll(left, -3, axis=1), config.load("default", None, {"num_disparities": 16}),
                         get_backend(device))
        except Exception:
            pass


def _write_state(lock, state) -> None:
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps(state))
    lock.flush()


def _serve_one(conn) -> bool:
    from . import cli
    try:
        conn.sendall(_READY)
        req = json.loads(_recv(conn))
    except (OSError, ValueError, ConnectionError):
        return False  # the client gave up waiting
    out, err = io.BytesIO(), io.BytesIO()
    saved = sys.stdout, sys.stderr, os.getcwd(), os.umask(req.get("umask", 0o022))
    # kept referenced until the bytes are sent: a collected wrapper closes its buffer
    wout = sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    werr = sys.stderr = io.TextIOWrapper(err, encoding="utf-8", write_through=True)
    try:
        os.chdir(req["cwd"])
    except OSError:  # the caller's folder is gone or not ours to enter: let it run the command itself
        sys.stdout, sys.stderr = saved[0], saved[1]
        os.umask(saved[3])
        _send(conn, json.dumps({"fallback": True}).encode())
        return False
    try:
        code = cli.main(list(req["argv"]), in_worker=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved[0], saved[1]
        os.chdir(saved[2])
        os.umask(saved[3])
    try:
        _send(conn, json.dumps({"code": code}).encode())
        _send(conn, out.getvalue())
        _send(conn, err.getvalue())
    except OSError:
        pass
    del wout, werr
    return True


if __name__ == "__main__":
    serve()
