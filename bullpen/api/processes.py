"""Several API processes on one port without a balancer: uvicorn's own supervisor.

The parent binds the listening socket once (`uvicorn.Config.bind_socket`) and starts N children
with `uvicorn.supervisors.Multiprocess`; each child inherits the socket and accepts from it, so
the kernel hands a new connection to whichever child takes it first (usually an idle one).
Children are spawned, not forked: a fresh interpreter each, with no event loop, connection
pool or thread of the parent's. A child receives only the settings and the server options
(`ChildConfig`) and builds the rest in `load()`, inside its server: Bullpen's logging, the app
and `edge.server_options` (the bounded protocol, limits and backlog), exactly as a
single-process server has them. Loading waits until then because those imports take seconds,
and a child answers the parent's health pings from its start, not once it has loaded.

The lifecycle is the supervisor's, unchanged:
- SIGTERM or SIGINT to the parent sends SIGTERM to every child; each stops accepting, lets its
  requests finish for the graceful-shutdown timeout and runs the app's shutdown (a worker
  drains); the parent waits for all of them and exits 0.
- A child that dies after it started serving (killed, out of memory) is replaced at once, and
  one that does not answer a health ping within `HEALTHCHECK_S` is killed and replaced.
- A child that fails while starting (its app's start-up raised: the database unreachable, a
  bad setting) would fail the same way again: the parent stops every child and `supervise`
  returns 1, for the service manager to see.
- SIGHUP replaces the children one at a time, each new one serving before the old one stops
  (one not serving within `HEALTHCHECK_S` is dropped, and the old ones keep running).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from bullpen import logs

if TYPE_CHECKING:
    from bullpen.settings import Settings

log = logging.getLogger(__name__)

# How long a child may take to answer the parent's health ping (uvicorn's default is 5 s): a
# child busy with a burst, on a machine short of CPU, must not be killed for it. The parent
# pings its children one at a time, so a hung child also delays the parent's other duties
# (a SIGTERM included) by up to this long.
HEALTHCHECK_S = 20


class ChildConfig(uvicorn.Config):
    """A server config that crosses to a spawned child as its settings and options, and is
    completed in the child by `load()` (the app and the protocol class cannot be pickled)."""

    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        # No log_config: Bullpen's logging, not uvicorn's, in the parent and in each child.
        super().__init__(_not_loaded, log_config=None, **options)
        self.spec = (settings, options)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ChildConfig, self.spec)

    def load(self) -> None:
        """In the child's server: Bullpen's logging, then the config a single server has."""
        from bullpen.api.app import create_app
        from bullpen.api.edge import server_options

        settings, options = self.spec
        logs.configure(settings.log_format)
        # The parent migrated before any child started; each child's pass finds nothing to do.
        logging.getLogger("bullpen.store.migrate").setLevel(logging.WARNING)
        try:
            app = create_app(settings)
        except Exception:  # it would fail the same way in every replacement: stop them all
            log.exception("the app could not be built")
            sys.exit(STARTUP_FAILURE)
        super().__init__(app, **server_options(settings, **options))
        super().load()


def supervise(settings: Settings, processes: int, **options: Any) -> int:
    """Serve on `settings`' host and port from `processes` children until SIGTERM or SIGINT;
    0 once all of them have stopped, 1 if one failed to start."""
    config = ChildConfig(
        settings,
        {
            "host": settings.host,
            "port": settings.port,
            "workers": processes,
            "timeout_worker_healthcheck": HEALTHCHECK_S,
            **options,
        },
    )
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    failed = any(child.exitcode == STARTUP_FAILURE for child in supervisor.processes)
    return 1 if failed else 0


async def _not_loaded(scope: Any, receive: Any, send: Any) -> None:
    """Stands for the app until a child's `load()`; the parent only supervises."""
    raise RuntimeError("the supervising process serves no requests")
