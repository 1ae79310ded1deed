"""Remote devices over gRPC: `ember rpc server` runs standalone exports for clients (`server.serve`), and
`connect("HOST:PORT", key=..., token=...)` uploads an export there and runs it like a local model (`client`).
Needs the `rpc` extra (grpcio, protobuf)."""

from .client import RemoteDevice, RemoteError, RemoteModel, connect

__all__ = ["RemoteDevice", "RemoteError", "RemoteModel", "connect"]
