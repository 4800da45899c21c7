"""A minimal stand-in for launchpad's courier RPC, for the oat engine's tests only (see ``local_runner``).

A :class:`Server` exposes the public methods of one object on a Unix socket; every connection is served by its own
thread, so calls from several clients (or from several futures of one client) run concurrently, as with courier.
A :class:`Client` is what a node receives in place of another node's handle: ``client.method(...)`` calls and waits,
``client.futures.method(...)`` returns a ``concurrent.futures.Future``. An exception raised by the remote method is
raised by the caller as :class:`RemoteError`, with the remote traceback in its message.
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Client as connect
from multiprocessing.connection import Connection, Listener

CONNECT_TIMEOUT_S = 900.0
"""How long a client keeps retrying to reach a server that is not listening yet (its node may still be starting)."""


class RemoteError(RuntimeError):
    """A remote method raised, or its node went away during the call."""


class Server:
    """Serves ``instance``'s public methods (names not starting with ``_``) at the Unix socket ``address``."""

    def __init__(self, instance, address: str, label: str) -> None:
        self._instance, self._label = instance, label
        self._listener = Listener(address, family="AF_UNIX")
        self._thread = threading.Thread(target=self._accept_loop, name=f"courier-{label}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                connection = self._listener.accept()
            except OSError:  # closed by stop()
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: Connection) -> None:
        """Answer one connection's calls in order until the caller hangs up; every call gets a reply."""
        with connection:
            while True:
                try:
                    request = connection.recv()
                except (EOFError, OSError):
                    return
                except Exception:
                    request = None
                    reply = "error", f"{self._label}: cannot read the call:\n{traceback.format_exc()}"
                if request is not None:
                    reply = self._call(*request)
                if not self._reply(connection, reply):
                    return

    def _reply(self, connection: Connection, reply: tuple) -> bool:
        try:
            connection.send(reply)
        except (EOFError, OSError):
            return False
        except Exception:
            connection.send(("error", f"{self._label}: cannot send the result:\n{traceback.format_exc()}"))
        return True

    def _call(self, name: str, args: tuple, kwargs: dict) -> tuple[str, object]:
        if name.startswith("_"):
            return "error", f"{self._label}: {name!r} is private (courier exposes public methods only)"
        try:
            return "ok", getattr(self._instance, name)(*args, **kwargs)
        except Exception:
            return "error", f"{self._label}.{name} raised:\n{traceback.format_exc()}"


class _Futures:
    """``client.futures.method(...)``: the call runs on the client's thread pool and a Future is returned."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return functools.partial(self._client._submit, name)


class Client:
    """A node's handle as another node sees it: method calls go over RPC to the node's :class:`Server`.

    Picklable (only the address and label travel); connections and the futures' thread pool are made on first use.
    """

    def __init__(self, address: str, label: str) -> None:
        self._address, self._label = address, label
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict:
        return {"address": self._address, "label": self._label}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["address"], state["label"])

    def __repr__(self) -> str:
        return f"<courier client of {self._label}>"

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return functools.partial(self._call, name)

    @property
    def futures(self) -> _Futures:
        return _Futures(self)

    def _submit(self, name: str, *args, **kwargs) -> Future:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"to-{self._label}")
        return self._pool.submit(self._call, name, *args, **kwargs)

    def _call(self, name: str, *args, **kwargs):
        connection = self._connection()
        try:
            connection.send((name, args, kwargs))
            status, value = connection.recv()
        except (EOFError, OSError) as error:
            connection.close()
            raise RemoteError(f"{self._label}.{name}: the node went away during the call") from error
        except BaseException:
            connection.close()
            raise
        with self._lock:
            self._idle.append(connection)
        if status == "error":
            raise RemoteError(value)
        return value

    def _connection(self) -> Connection:
        """An idle connection, else a new one (retried while the server's node is still starting)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                return connect(self._address, family="AF_UNIX")
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise RemoteError(f"{self._label} is not serving at {self._address}") from None
                time.sleep(0.1)
