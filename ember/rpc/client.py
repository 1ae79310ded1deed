"""The client of a device server (`ember.rpc.server`): upload a standalone export, run it there like a local model.

    remote = ember.rpc.connect("127.0.0.1:9090", key="arm-a72", token=token)
    remote.info()                                   # {"key": ..., "arch": "aarch64", "launcher": [...], ...}
    rm = remote.load(m.export("out/arm"))           # uploads ember_run and weights.bin; model.json names the tensors
    y = rm(x); outs = rm.run({"x": x}); rm.benchmark(repeat=20)   # numpy in, numpy out; timed on the device
    rm.close(); remote.close()                      # or use both as context managers

With `root_cert` (a PEM file or its bytes: the server's certificate, or the authority that signed it) the channel is
TLS and the server's certificate is verified against it, for the host name of the address (or `server_name`).

Inputs are checked here (names, count, shape, dtype) before anything is sent; arrays travel as .npy bytes and come
back through np.load(allow_pickle=False). A refused or failed call raises RemoteError with the gRPC status code
(UNAUTHENTICATED for a wrong token, RESOURCE_EXHAUSTED for a message over the bound, ABORTED for a module that
crashed, DEADLINE_EXCEEDED for one that ran past the server's time limit) and the server's message.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from ..runtime.model import check_feeds, random_arrays
from ..tir.dtype import numpy_dtype
from . import ember_rpc_pb2 as pb
from . import ember_rpc_pb2_grpc as pb_grpc
from .server import ALLOWED_FILES, MAX_MESSAGE_BYTES, TOKEN_METADATA


class RemoteError(RuntimeError):
    """A call to a device server failed: `code` is the gRPC status code, the message is the server's."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.code = code


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(x), allow_pickle=False)
    return buf.getvalue()


class RemoteDevice:
    """A connection to a device server: `info()`, `load(export_dir)`, `close()`."""

    def __init__(self, address: str, token: str | None, key: str | None = None, timeout: float = 60.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, root_cert: str | Path | bytes | None = None,
                 server_name: str | None = None):  # fmt: skip
        self.address = address
        self.timeout = timeout
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]  # fmt: skip
        if root_cert is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            credentials = grpc.ssl_channel_credentials(root_certificates=_pem(root_cert))
            self._channel = grpc.secure_channel(address, credentials, options=options)
        self._stub = pb_grpc.DeviceStub(self._channel)
        self._metadata = ((TOKEN_METADATA, token),) if token else ()
        try:
            self._info = self.info()
        except RemoteError:
            self._channel.close()
            raise
        if key is not None and self._info["key"] != key:
            self._channel.close()
            raise RemoteError(f"{address} serves device {self._info['key']!r}, not {key!r}")
        self.key = self._info["key"]

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """One call of the Device service; a failure raises RemoteError naming the method, status and message."""
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            name = code.name if code is not None else "error"
            raise RemoteError(f"{self.address} {method}: {name}: {details}", code) from None

    def info(self, timeout: float | None = None) -> dict:
        """The server's device key, architecture and GNU triple, launcher (emulator command, [] when native),
        version, message bound, whether it uses TLS, and its load: runs in flight (`running`) and waiting for their
        module, modules held (`sessions`), runs finished."""
        r = self.call("Info", pb.InfoRequest(), timeout=timeout)
        return {"key": r.key, "arch": r.arch, "triple": r.triple, "launcher": list(r.launcher), "version": r.version,
                "max_message_bytes": r.max_message_bytes, "tls": r.tls, "running": r.running, "waiting": r.waiting,
                "sessions": r.sessions, "runs_done": r.runs_done}  # fmt: skip

    def load(self, directory: str | Path) -> RemoteModel:
        """Upload a standalone export (a directory written by `m.export(dir)`: its ember_run, weights.bin and
        model.json) and return the model it became on the server."""
        directory = Path(directory)
        meta_path = directory / "model.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{directory} has no model.json: load wants a directory written by "
                                    f"`m.export(dir)` (`ember export`)")  # fmt: skip
        meta = json.loads(meta_path.read_text())
        missing = [n for n in ALLOWED_FILES if not (directory / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{directory} has no {', '.join(missing)}: export it with build=True")
        files = [pb.File(name=n, data=(directory / n).read_bytes()) for n in ALLOWED_FILES]
        reply = self.call("Upload", pb.UploadRequest(files=files))
        return RemoteModel(self, reply.module_id, meta)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RemoteDevice:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteDevice({self.address!r}, key={self.key!r}, arch={self._info['arch']!r})"


def _shape(dims: list) -> tuple[int, ...] | None:
    """A tensor's shape from model.json; None where a dim is symbolic (named: ember_run checks it on the device)."""
    return tuple(dims) if all(isinstance(d, int) for d in dims) else None


class RemoteModel:
    """A model uploaded to a device server: `run(dict)`, `model(*arrays)`, `benchmark(repeat=)`, `close()`."""

    def __init__(self, device: RemoteDevice, module_id: str, meta: Mapping):
        self.device = device
        self.module_id = module_id
        self.name = meta.get("name", "model")
        self.target = meta.get("target")
        self.inputs = [(t["name"], numpy_dtype(t["dtype"]), _shape(t["shape"])) for t in meta["inputs"]]
        self.outputs = [(t["name"], numpy_dtype(t["dtype"]), _shape(t["shape"])) for t in meta["outputs"]]
        self.input_names = [n for n, _, _ in self.inputs]
        self.output_names = [n for n, _, _ in self.outputs]
        self.closed = False

    def _check(self, feeds: Mapping[str, Any] | tuple | list) -> list[np.ndarray]:
        """The inputs in graph order as contiguous arrays; wrong names, count, shape or dtype raise ArgumentError."""
        return check_feeds(self.name, self.inputs, feeds)

    def _run(self, arrays: list[np.ndarray], repeat: int, warmup: int) -> tuple[dict[str, np.ndarray], dict]:
        if self.closed:
            raise RemoteError(f"model {self.name} was closed")
        request = pb.RunRequest(module_id=self.module_id, repeat=repeat, warmup=warmup,
                                inputs=[pb.Tensor(name=n, npy=_npy(x)) for n, x in zip(self.input_names, arrays)])
        reply = self.device.call("Run", request)
        got = {}
        for t in reply.outputs:
            try:
                got[t.name] = np.load(io.BytesIO(t.npy), allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise RemoteError(f"output {t.name!r} from {self.device.address} is not a .npy array: {e}") from e
        missing = [n for n in self.output_names if n not in got]
        if missing:
            raise RemoteError(f"{self.device.address} returned no output {missing} for model {self.name}")
        return {n: got[n] for n in self.output_names}, json.loads(reply.timings_json)

    def run_timed(self, feeds: Mapping[str, Any] | list | tuple, repeat: int = 1,
                  warmup: int = 0) -> tuple[dict[str, np.ndarray], dict]:  # fmt: skip
        """(outputs by name, ember_run's timing record) of one Run call: `repeat` timed inferences after `warmup`
        untimed ones, on the device; the record holds min, median and mean seconds."""
        if repeat < 1 or warmup < 0:
            raise ValueError("run_timed wants repeat >= 1 and warmup >= 0")
        return self._run(self._check(feeds), repeat, warmup)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Inputs by name in, outputs by name out, computed on the device."""
        return self._run(self._check(feeds), 1, 0)[0]

    def __call__(self, *inputs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        outs = list(self._run(self._check(inputs), 1, 0)[0].values())
        return outs[0] if len(outs) == 1 else tuple(outs)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random arrays for the inputs: normal floats, fair bools, small non-negative integers."""
        return random_arrays(self.inputs, seed)

    def benchmark(self, inputs: Mapping[str, Any] | list | None = None, repeat: int = 20, warmup: int = 3) -> dict:
        """Latency of whole inferences timed on the device (ember_run --repeat): median, mean, min (seconds)."""
        if repeat < 1 or warmup < 0:
            raise ValueError("benchmark wants repeat >= 1 and warmup >= 0")
        arrays = self._check(inputs if inputs is not None else self.random_inputs())
        timings = self._run(arrays, repeat, warmup)[1]
        return {k: timings[k] for k in ("median", "mean", "min", "repeat", "warmup", "threads") if k in timings}

    def close(self) -> None:
        """Remove the module (and its directory) from the server."""
        if not self.closed:
            self.closed = True
            self.device.call("Close", pb.CloseRequest(module_id=self.module_id))

    def __enter__(self) -> RemoteModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteModel({self.name!r} on {self.device.address}, inputs={self.input_names})"


def _pem(cert: str | Path | bytes) -> bytes:
    data = cert if isinstance(cert, bytes) else Path(cert).read_bytes()
    if b"-----BEGIN CERTIFICATE" not in data:
        raise ValueError(f"the root certificate {'given' if isinstance(cert, bytes) else cert} is not a PEM "
                         f"certificate (no -----BEGIN CERTIFICATE line)")  # fmt: skip
    return data


def connect(address: str, key: str | None = None, token: str | None = None, timeout: float = 60.0,
            max_message_bytes: int = MAX_MESSAGE_BYTES, root_cert: str | Path | bytes | None = None,
            server_name: str | None = None) -> RemoteDevice:  # fmt: skip
    """Connect to the device server at "HOST:PORT" with its `token`; with `key`, check it serves that device.
    With `root_cert` (PEM) the connection is TLS, the server's certificate checked against it (for `server_name`
    when given, else the address's host). Raises RemoteError when it refuses (a wrong token: UNAUTHENTICATED) or
    cannot be reached."""
    return RemoteDevice(address, token, key, timeout, max_message_bytes, root_cert, server_name)
