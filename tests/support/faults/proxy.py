"""A TCP proxy between one engine and PostgreSQL that can cut the network.

`cut()` stops forwarding in both directions and stops accepting, keeping every
socket open: what a partition looks like to both ends (nothing arrives, nothing is
refused; what was sent waits, as TCP would retransmit it). `close_server_side()`
then closes the proxy's connections to the server, as the server's keepalive does
to a silent peer: PostgreSQL ends those sessions and releases their locks, while
the engine's side stays open and silent. `heal()` forwards again; a connection
whose server side was closed is closed on the engine's side too, so the engine
sees it fail and reconnects.
"""

import contextlib
import selectors
import socket
import threading


class Proxy:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        # client socket -> server socket, and back
        self._peer: dict[socket.socket, socket.socket] = {}
        self._server_closed: set[socket.socket] = set()  # client sockets
        self._cut = False
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        with self._lock:
            if self._cut:
                return
            self._cut = True
            for sock in [self.listener, *self._peer]:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
        self._wake()

    def close_server_side(self) -> None:
        with self._lock:
            for client, server in list(self._peer.items()):
                if client in self._server_closed or server in self._server_closed:
                    continue
                if self._is_client(client):
                    self._server_closed.add(client)
                    del self._peer[server]
                    with contextlib.suppress(OSError):
                        server.close()

    def heal(self) -> None:
        with self._lock:
            for client in list(self._server_closed):
                self._peer.pop(client, None)
                with contextlib.suppress(OSError):
                    client.close()
            self._server_closed.clear()
            if self._cut:
                self._cut = False
                self._selector.register(self.listener, selectors.EVENT_READ, "accept")
                for sock in self._peer:
                    self._selector.register(sock, selectors.EVENT_READ, "data")
        self._wake()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        self._thread.join(5)
        with self._lock:
            for sock in list(self._peer):
                with contextlib.suppress(OSError):
                    sock.close()
            self._peer.clear()
        self.listener.close()

    def _is_client(self, sock) -> bool:
        return sock.getsockname()[1] == self.port

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.5):
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                elif key.data == "accept":
                    self._accept()
                else:
                    self._forward(key.fileobj)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            with contextlib.suppress(NameError, OSError):
                client.close()
            return
        server.settimeout(None)
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._peer[client] = server
            self._peer[server] = client
            if not self._cut:
                self._selector.register(client, selectors.EVENT_READ, "data")
                self._selector.register(server, selectors.EVENT_READ, "data")

    def _forward(self, source) -> None:
        with self._lock:
            # Cut since the selector answered: nothing is read, so what was sent
            # waits in the kernel and goes on once healed, as TCP would retransmit
            # it. Read now and dropped, it would leave a hole in the stream.
            if self._cut:
                return
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            sink = self._peer.get(source)
            if data and sink is not None:
                try:
                    sink.sendall(data)
                    return
                except OSError:
                    pass
            # One side closed (or failed): close both.
            for sock in (source, sink):
                if sock is None:
                    continue
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                self._peer.pop(sock, None)
                self._server_closed.discard(sock)
                with contextlib.suppress(OSError):
                    sock.close()
