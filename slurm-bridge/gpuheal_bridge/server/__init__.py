"""HTTP server of the bridge: FastAPI app, auth, idempotency, audit log, metrics."""

from gpuheal_bridge.server.app import BridgeSettings, create_app

__all__ = ["BridgeSettings", "create_app"]
