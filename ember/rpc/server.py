"""The device server: runs uploaded standalone exports (`ember_run` and `weights.bin`) on this machine, or through
an emulator, for clients elsewhere (`ember.rpc.connect`).

    server = serve("127.0.0.1", 9090, key="arm-a72", token=token, launcher="qemu-aarch64 -L /usr/aarch64-linux-gnu")
    server.port; server.wait(); server.stop()
    ember rpc server --port 9090 --key arm-a72 --token-file token.txt       # the same from the command line

Security: every call must carry the token (metadata "ember-token", compared with hmac.compare_digest) or it is
refused with UNAUTHENTICATED; the server binds the loopback address unless told otherwise; messages are bounded
(`max_message_bytes`); uploads are only "ember_run" (an ELF executable) and "weights.bin"; arrays travel as .npy
bytes loaded without pickle; each module runs in a child process with a time limit (its process group is killed
past it), so a module that crashes or hangs fails its run and the server keeps serving. Each upload is a session with
its own directory under the server's temporary root, removed on Close, when idle past `idle_timeout`, and on stop.
With `tls_cert`/`tls_key` (PEM files: `--tls-cert/--tls-key`) the server listens with TLS only, so the token and the
data are encrypted; without them they travel in clear text: beyond loopback, use TLS, a trusted network or an SSH
tunnel. Info reports the device's key, architecture and triple, and its load (runs in flight and waiting, modules
held), which the device pool's health checks and `ember rpc pool status` read.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from . import ember_rpc_pb2 as pb
from . import ember_rpc_pb2_grpc as pb_grpc

TOKEN_METADATA = "ember-token"
MAX_MESSAGE_BYTES = 256 << 20
ALLOWED_FILES = {"ember_run": 0o700, "weights.bin": 0o600}
_ELF_MAGIC = b"\x7fELF"


def _version() -> str:
    from .. import __version__

    return __version__


def device_triple(arch: str) -> str:
    """The GNU triple of an architecture name as Info reports it (aarch64 -> aarch64-linux-gnu); "" if unknown."""
    from ..target import TargetError, normalize_triple

    try:
        return normalize_triple(f"{arch}-linux-{'gnueabihf' if arch.startswith('arm') else 'gnu'}")
    except TargetError:
        return ""


def launcher_arch(launcher: Sequence[str] | None) -> str:
    """The architecture modules run on: qemu-user's (`qemu-aarch64 ...` -> aarch64), else this machine's."""
    if launcher:
        m = re.fullmatch(r"qemu-(\w+)(-static)?", Path(launcher[0]).name)
        if m:
            return m.group(1)
    return platform.machine()


@dataclass
class _Session:
    directory: Path
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses every call whose "ember-token" metadata is not the server's token (UNAUTHENTICATED)."""

    def __init__(self, token: str | None):
        self._token = None if token is None else token.encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token (ember-token metadata)")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        if self._token is None:
            return continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA, "")
        given = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given, self._token):
            return continuation(handler_call_details)
        return self._deny


class DeviceService(pb_grpc.DeviceServicer):
    """The Device service: Info, Upload (a session), Run (in a child process), Close."""

    def __init__(self, root: Path, key: str, launcher: Sequence[str] | None, run_timeout: float,
                 idle_timeout: float, max_sessions: int, max_message_bytes: int, tls: bool = False):  # fmt: skip
        self.root = root
        self.tls = tls
        self.running = self.waiting = self.runs_done = 0
        self.key = key
        self.launcher = list(launcher or [])
        self.run_timeout = run_timeout
        self.idle_timeout = idle_timeout
        self.max_sessions = max_sessions
        self.max_message_bytes = max_message_bytes
        self.sessions: dict[str, _Session] = {}
        self.lock = threading.Lock()

    # sessions
    def expire(self, now: float | None = None) -> list[str]:
        """Remove the sessions idle longer than `idle_timeout`; their ids."""
        now = time.monotonic() if now is None else now
        with self.lock:
            old = [i for i, s in self.sessions.items() if now - s.last_used > self.idle_timeout and not s.lock.locked()]
            gone = [(i, self.sessions.pop(i)) for i in old]
        for _, s in gone:
            with s.lock:  # a run that took it just before it expired finishes first
                shutil.rmtree(s.directory, ignore_errors=True)
        return old

    def close_all(self) -> None:
        with self.lock:
            gone, self.sessions = list(self.sessions.values()), {}
        for s in gone:
            shutil.rmtree(s.directory, ignore_errors=True)

    def _session(self, module_id: str, context) -> _Session:
        with self.lock:
            s = self.sessions.get(module_id)
            if s is not None:
                s.last_used = time.monotonic()
        if s is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no module {module_id!r} (closed, expired, or never uploaded)")
        return s

    # the service
    def Info(self, request, context):
        arch = launcher_arch(self.launcher)
        with self.lock:
            load = {"running": self.running, "waiting": self.waiting, "sessions": len(self.sessions),
                    "runs_done": self.runs_done}  # fmt: skip
        return pb.InfoReply(key=self.key, arch=arch, launcher=self.launcher, version=_version(),
                            max_message_bytes=self.max_message_bytes, triple=device_triple(arch), tls=self.tls,
                            **load)  # fmt: skip

    def Upload(self, request, context):
        names = [f.name for f in request.files]
        bad = [n for n in names if n not in ALLOWED_FILES]
        if bad or len(set(names)) != len(names) or set(names) != set(ALLOWED_FILES):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"an upload is exactly the files {sorted(ALLOWED_FILES)} of a standalone export, got "
                          f"{names}")  # fmt: skip
        files = {f.name: f.data for f in request.files}
        if not files["ember_run"].startswith(_ELF_MAGIC):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "ember_run is not an executable (no ELF header): upload the ember_run that `export` built")
        self.expire()
        with self.lock:
            if len(self.sessions) >= self.max_sessions:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the server holds {self.max_sessions} modules: close one first")  # fmt: skip
            module_id = secrets.token_hex(16)
            directory = self.root / module_id
            directory.mkdir(mode=0o700)
            self.sessions[module_id] = _Session(directory, time.monotonic())
        for name, data in files.items():
            path = directory / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ALLOWED_FILES[name])
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return pb.UploadReply(module_id=module_id)

    def Close(self, request, context):
        with self.lock:
            s = self.sessions.pop(request.module_id, None)
        if s is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no module {request.module_id!r}")
        with s.lock:  # after a run in flight
            shutil.rmtree(s.directory, ignore_errors=True)
        return pb.CloseReply()

    def Run(self, request, context):
        s = self._session(request.module_id, context)
        if request.repeat < 0 or request.warmup < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "repeat and warmup must not be negative")
        self._count(waiting=1)
        with s.lock:
            self._count(waiting=-1, running=1)
            try:
                if not s.directory.exists():
                    context.abort(grpc.StatusCode.NOT_FOUND, f"module {request.module_id!r} was closed")
                run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=s.directory))
                try:
                    return self._run(s.directory, run_dir, request, context)
                finally:
                    shutil.rmtree(run_dir, ignore_errors=True)
                    s.last_used = time.monotonic()
            finally:
                self._count(running=-1, runs_done=1)

    def _count(self, **delta: int) -> None:
        with self.lock:
            for name, d in delta.items():
                setattr(self, name, getattr(self, name) + d)

    def _run(self, module: Path, run_dir: Path, request, context) -> pb.RunReply:
        cmd = [*self.launcher, str(module / "ember_run")]
        for i, t in enumerate(request.inputs):
            try:
                x = np.load(io.BytesIO(t.npy), allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"input {t.name!r} is not a .npy array: {e}")
            path = run_dir / f"input_{i}.npy"
            np.save(path, x, allow_pickle=False)
            cmd += ["--input", f"{t.name}={path}"]
        out = run_dir / "outputs"
        out.mkdir()
        cmd += ["--output-dir", str(out), "--repeat", str(max(request.repeat, 1)), "--warmup", str(request.warmup)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                cwd=run_dir, start_new_session=True)  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=self.run_timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"the module ran past the server's run timeout ({self.run_timeout:g} s) and was killed")
        finally:
            _kill_group(proc)  # anything it left behind in its process group
        err = stderr.decode(errors="replace").strip()[-4000:]
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode).name if -proc.returncode in signal.valid_signals() else "?"
            context.abort(grpc.StatusCode.ABORTED,
                          f"the module crashed: killed by signal {-proc.returncode} ({sig}). {err}".strip())
        if proc.returncode == 2:  # ember_run: a bad input, named
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ember_run refused the inputs: {err}")
        if proc.returncode != 0:
            context.abort(grpc.StatusCode.ABORTED, f"the module exited with status {proc.returncode}: {err}")
        lines = [ln for ln in stdout.decode(errors="replace").splitlines() if ln.startswith("{")]
        try:
            timings = json.loads(lines[-1])
            files = dict(timings["outputs"])
        except (IndexError, ValueError, KeyError, TypeError):
            context.abort(grpc.StatusCode.ABORTED, f"the module printed no timing line: {stdout[:1000]!r}")
        outputs = []
        for name, path in files.items():
            path = Path(path).resolve()
            if path.parent != out.resolve():
                context.abort(grpc.StatusCode.ABORTED, f"output {name!r} was written outside the output directory")
            outputs.append(pb.Tensor(name=name, npy=path.read_bytes()))
        timings["outputs"] = list(files)
        return pb.RunReply(outputs=outputs, timings_json=json.dumps(timings))


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        proc.communicate()


class DeviceServer:
    """A running device server: `port` (the one bound), `address`, `stop()`, `wait()`; a context manager."""

    def __init__(self, server: grpc.Server, service: DeviceService, host: str, port: int, root: Path,
                 reaper_period: float):  # fmt: skip
        self._server = server
        self.service = service
        self.host = host
        self.port = port
        self.root = root
        self._stopped = threading.Event()
        self._reaper = threading.Thread(target=self._reap, args=(reaper_period,), daemon=True,
                                        name="ember-rpc-reaper")  # fmt: skip
        self._reaper.start()

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def _reap(self, period: float) -> None:
        while not self._stopped.wait(period):
            self.service.expire()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving (calls in flight get `grace` seconds), remove every session and the temporary root."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._server.stop(grace).wait()
        self.service.close_all()
        shutil.rmtree(self.root, ignore_errors=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or `timeout` seconds); True when it has stopped."""
        return self._server.wait_for_termination(timeout)

    def __enter__(self) -> DeviceServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(host: str = "127.0.0.1", port: int = 0, key: str = "local", token: str | None = None,
          launcher: Sequence[str] | str | None = None, *, insecure: bool = False, run_timeout: float = 600.0,
          idle_timeout: float = 600.0, max_message_bytes: int = MAX_MESSAGE_BYTES, max_sessions: int = 64,
          workers: int = 8, root: str | Path | None = None, tls_cert: str | Path | None = None,
          tls_key: str | Path | None = None) -> DeviceServer:  # fmt: skip
    """Start a device server on `host:port` (port 0: a free one, see `.port`) answering to device `key`.

    `token` is the secret every call must carry; without one the server refuses to start unless `insecure`.
    `launcher` is the command prefix modules run through (an emulator: "qemu-aarch64 -L /usr/aarch64-linux-gnu").
    A run is killed past `run_timeout` seconds; a session idle past `idle_timeout` seconds is removed; messages
    over `max_message_bytes` are refused. Sessions live under a new temporary directory in `root`.
    `tls_cert` and `tls_key` (PEM files, both or neither) make it listen with TLS only."""
    if not token and not insecure:
        raise ValueError("the device server needs a token (every call must carry it); pass insecure=True "
                         "(--insecure) to serve without one")  # fmt: skip
    if isinstance(launcher, str):
        launcher = launcher.split()
    if launcher and shutil.which(launcher[0]) is None:
        raise ValueError(f"launcher {launcher[0]!r} is not installed here")
    if run_timeout <= 0 or idle_timeout <= 0 or max_message_bytes <= 0:
        raise ValueError("run_timeout, idle_timeout and max_message_bytes must be positive")
    credentials = _tls_credentials(tls_cert, tls_key)
    tmp = Path(tempfile.mkdtemp(prefix="ember-rpc-", dir=root))
    service = DeviceService(tmp, key, launcher, run_timeout, idle_timeout, max_sessions, max_message_bytes,
                            tls=credentials is not None)  # fmt: skip
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes)]  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-rpc"),
                         interceptors=[_TokenCheck(token or None)], options=options)  # fmt: skip
    pb_grpc.add_DeviceServicer_to_server(service, server)
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(bind) if credentials is None else server.add_secure_port(bind, credentials)
    except RuntimeError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"cannot listen on {bind}: {e}") from e
    if bound == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"cannot listen on {bind}")
    server.start()
    return DeviceServer(server, service, host, bound, tmp, reaper_period=min(idle_timeout / 2, 30.0))


def _tls_credentials(cert: str | Path | None, key: str | Path | None) -> grpc.ServerCredentials | None:
    """TLS credentials of the server's certificate chain and private key (PEM files); None without either."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both a certificate and its private key (--tls-cert and --tls-key)")
    pems = []
    for what, path in (("certificate", cert), ("private key", key)):
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ValueError(f"cannot read the TLS {what} {path}: {e}") from e
        if b"-----BEGIN" not in data:
            raise ValueError(f"the TLS {what} {path} is not a PEM file (no -----BEGIN line)")
        pems.append(data)
    return grpc.ssl_server_credentials([(pems[1], pems[0])])
