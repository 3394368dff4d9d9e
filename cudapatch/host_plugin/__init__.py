"""Host integration: pluggy plugins, the HostAdapter and the engine operator (not built yet)."""

NAME = "cudapatch"

__all__ = ["NAME"]
