"""Remote devices over gRPC: `ember rpc server` runs standalone exports for clients (`server.serve`, optional TLS),
and `connect("HOST:PORT", key=..., token=...)` uploads an export there and runs it like a local model (`client`).
`pool.DevicePool` lends device servers by key (embedded in the client's process), `raypool.RayDevicePool` does the
same on a Ray cluster, and `measure.RemoteMeasurer` / `raypool.RayMeasurer` measure tuning candidates on them.
Needs the `rpc` extra (grpcio, protobuf); the Ray pool needs the `ray` extra."""

from .client import RemoteDevice, RemoteError, RemoteModel, connect
from .pool import DeviceLost, DevicePool, PoolError

__all__ = ["DeviceLost", "DevicePool", "PoolError", "RemoteDevice", "RemoteError", "RemoteModel", "connect"]
