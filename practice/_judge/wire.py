"""The wire between the judge and the process that runs the reader's code.

Frames are length-prefixed pickles on a socket. The two directions are not
trusted alike:

* judge -> reader's process: an ordinary pickle (the judge's own data).
* reader's process -> judge: :func:`loads_plain`, an unpickler that refuses
  every class. Only plain data comes back (None, bool, int, float, complex,
  str, bytes, list, tuple, dict, set, frozenset) plus two tagged kinds made
  by :func:`plain_pickler`'s ``persistent_id``: a tensor as its dtype, shape
  and values, and a *handle* for any other object, which stays in the
  reader's process. Nothing the reader's code sends can run code in the
  judge.

Standard library only.
"""

import io
import pickle
import struct
import time

MAX_FRAME_BYTES = 256 * 1024 * 1024
_HEADER = struct.Struct("!Q")
PLAIN_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    list,
    tuple,
    dict,
    set,
    frozenset,
)


class WireError(Exception):
    """A frame that is not what the protocol says (cut short, too big, refused)."""


def send(sock, obj, pickler=None):
    buf = io.BytesIO()
    (pickler or pickle.Pickler)(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    data = buf.getvalue()
    sock.sendall(_HEADER.pack(len(data)) + data)


def recv_bytes(sock, deadline=None):
    """One frame's bytes; ``EOFError`` when the other end is gone.

    ``deadline`` (``time.monotonic()``): ``TimeoutError`` after it.
    """
    header = _read_exactly(sock, _HEADER.size, deadline)
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise WireError(f"a frame of {size} bytes (more than the limit)")
    return _read_exactly(sock, size, deadline)


def _read_exactly(sock, n, deadline=None):
    chunks, got = [], 0
    while got < n:
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except TimeoutError:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("no answer in time") from None
            continue
        if not chunk:
            raise EOFError("the other end closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, file, persistent_load):
        super().__init__(file)
        self._load = persistent_load

    def find_class(self, module, name):
        if (module, name) == ("builtins", "complex"):
            return complex
        raise WireError(f"refused to load {module}.{name}: only plain data comes back")

    def persistent_load(self, pid):
        return self._load(pid)


def loads_plain(data, persistent_load):
    """Decode a frame from the reader's process: plain data and tagged ids only."""
    try:
        return _PlainUnpickler(io.BytesIO(data), persistent_load).load()
    except WireError:
        raise
    except Exception as e:  # a malformed pickle
        raise WireError(f"a malformed reply ({type(e).__name__}: {e})") from None


def plain_pickler(keep):
    """A pickler class for the reader's side: non-plain objects become tags.

    ``keep(obj)`` stores an object in the reader's process and returns its
    handle number.
    """

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            kind = type(obj)
            if kind in PLAIN_TYPES:
                return None
            torch = _torch()
            if torch is not None and isinstance(obj, torch.Tensor):
                t = obj.detach().cpu()
                return (
                    "t",
                    str(t.dtype).replace("torch.", ""),
                    tuple(t.shape),
                    t.flatten().tolist(),
                )
            if isinstance(obj, bool):
                return ("v", bool(obj))
            if isinstance(obj, (int, float, complex, str, bytes)):
                return ("v", kind.__mro__[-2](obj))  # an int subclass: its int
            if isinstance(obj, (list, tuple, dict, set, frozenset)):
                base = next(b for b in kind.__mro__ if b in PLAIN_TYPES)
                return ("c", base.__name__, _copy_plain(obj, base))
            if hasattr(obj, "item") and hasattr(obj, "dtype") and _is_scalar(obj):
                return ("v", obj.item())  # a numpy or torch scalar
            callable_ = callable(obj)
            try:
                text = repr(obj)
            except Exception:
                text = f"<{kind.__name__} object>"
            return ("h", keep(obj), kind.__name__, text[:300], callable_)

    return Pickler


def _copy_plain(obj, base):
    if base is dict:
        return dict(obj)
    return base(obj)


def _is_scalar(obj):
    try:
        return getattr(obj, "shape", None) in ((), None) or obj.ndim == 0
    except Exception:
        return False


def _torch():
    import sys

    return sys.modules.get("torch")
