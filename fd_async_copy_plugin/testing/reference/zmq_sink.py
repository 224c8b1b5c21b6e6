"""In-process stand-in for the ZMQ PUSH socket of FastDeploy's V1 output path.

With ``FD_USE_GET_SAVE_OUTPUT_V1=1`` the runner's output thread (``_async_output_busy_loop``)
pickles each step's list of ``StreamTransferData`` with ``send_pyobj`` to the socket
``get_save_output_rank{local_rank}_{port}``. ``ZmqIpcClient`` here keeps FastDeploy's API
(``connect()``, ``socket.SNDTIMEO``, ``send_pyobj``) and appends the pickled bytes to a ``Sink``
found by the socket name, where the driver reads them.

Pickling is the point: it is where the output thread turns tensors into bytes, i.e. where a
not-yet-landed pinned buffer would be read.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace


@dataclass
class Sink:
    name: str
    payloads: list[bytes] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def push(self, payload: bytes) -> None:
        with self._cond:
            self.payloads.append(payload)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self.errors.append(error)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        """Block until ``count`` payloads (or errors) have arrived."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.payloads) + len(self.errors) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"sink {self.name!r}: {len(self.payloads)} of {count} payloads after {timeout}s"
                    )
                self._cond.wait(left)

    def take(self) -> list[bytes]:
        with self._cond:
            out, self.payloads = self.payloads, []
        return out


_LOCK = threading.Lock()
_SINKS: dict[str, Sink] = {}


def get_sink(name: str) -> Sink:
    with _LOCK:
        sink = _SINKS.get(name)
        if sink is None:
            sink = _SINKS[name] = Sink(name)
        return sink


def drop_sink(name: str) -> None:
    with _LOCK:
        _SINKS.pop(name, None)


class ZmqIpcClient:
    """FastDeploy's ``inter_communicator.ZmqIpcClient`` (PUSH mode), delivering in process."""

    def __init__(self, name: str, mode=None) -> None:
        self.name = name
        self.mode = mode
        self.socket = SimpleNamespace(SNDTIMEO=-1)
        self._sink: Sink | None = None

    def connect(self) -> None:
        self._sink = get_sink(self.name)

    def send_pyobj(self, obj) -> None:
        if self._sink is None:
            raise RuntimeError(f"ZmqIpcClient {self.name!r} is not connected")
        try:
            payload = pickle.dumps(obj)
        except BaseException as error:  # surfaced to the driver, which fails the run loudly
            self._sink.fail(error)
            raise
        self._sink.push(payload)


class OutputQueue(queue.Queue):
    """The runner's ``async_output_queue`` (a ``queue.Queue`` as in FastDeploy) that also counts
    ``put`` calls, so the driver can wait until the output thread has sent everything queued."""

    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    def put(self, item, block=True, timeout=None):
        self.puts += 1
        super().put(item, block, timeout)


#: Put on ``async_output_queue`` by ``close()`` to end the output thread (replica only).
_SHUTDOWN = object()


class AsyncOutputThread:
    """The model runner's V1 output thread, the same in 2.4 and 2.5 (not a patch point): a
    ``ZmqIpcClient`` to ``get_save_output_rank{local_rank}_{port}``, the ``async_output_queue``
    that ``post_process``/``save_output_normal`` put ``StreamTransferData`` lists on, and the
    daemon thread sending them."""

    def _start_async_output_thread(self, local_rank: int, port) -> None:
        self.zmq_client = ZmqIpcClient(name=f"get_save_output_rank{local_rank}_{port}")
        self.zmq_client.connect()
        self.zmq_client.socket.SNDTIMEO = 3000
        self.async_output_queue: queue.Queue = OutputQueue()
        self.async_output_copy_thread = threading.Thread(
            target=self._async_output_busy_loop, daemon=True, name="WorkerAsyncOutputCopy"
        )
        self.async_output_copy_thread.start()

    def _async_output_busy_loop(self):
        """Entrypoint for the thread which handles outputs asynchronously."""
        while True:
            try:
                output = self.async_output_queue.get()
                if output is _SHUTDOWN:
                    return
                self.zmq_client.send_pyobj(output)
            except Exception:  # FastDeploy logs and keeps the thread alive
                pass

    def close(self) -> None:
        """Replica only: end the output thread (FastDeploy's runs until the process exits)."""
        if self.async_output_queue is not None:
            self.async_output_queue.put(_SHUTDOWN)
            self.async_output_copy_thread.join(timeout=10)
