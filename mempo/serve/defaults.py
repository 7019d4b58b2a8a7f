"""The agent server's default bounds (a light module: the `mempo serve` parser reads them without
importing the agent, torch or fastapi)."""

__all__ = ["DEFAULT_PORT", "DEFAULT_MAX_IN_FLIGHT", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_PING_S",
           "DEFAULT_REQUEST_DEADLINE", "DEFAULT_KEEP_ALIVE"]

DEFAULT_PORT = 8300  # the retrieval server's default is 8000: both can run on one machine
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a question is text; a long chat history fits
DEFAULT_PING_S = 0.5  # seconds between ": ping" comments of a stream (client read timeouts count between bytes)
DEFAULT_REQUEST_DEADLINE = 300.0  # seconds a request may run (the openai client's default timeout is 600 s)
DEFAULT_KEEP_ALIVE = 30  # seconds an idle connection is kept: above httpx's 5 s pool expiry
