"""Real file-system refusals for fault tests, in a process's own mount namespace (Linux, root or
CAP_SYS_ADMIN; `available()` says whether this machine allows them): a folder remounted read-only
(EROFS) and a small tmpfs (ENOSPC). Call them in a forked child: the mounts vanish with it and
no other process sees them."""
import ctypes
import ctypes.util
import os
import tempfile
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _call(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    encode = lambda value: None if value is None else str(value).encode()  # noqa: E731
    _call(_libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def private_namespace() -> None:
    """This process gets mounts of its own (changes are seen by no other process)."""
    _call(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def read_only(path: Path) -> None:
    """`path` (a folder) read-only from now on, in this namespace: writes fail with EROFS."""
    _mount(path, path, None, MS_BIND)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def small_disk(path: Path, size: int) -> None:
    """An empty tmpfs of `size` bytes on `path`, in this namespace: writes past it fail with ENOSPC."""
    _mount("tmpfs", path, "tmpfs", 0, f"size={size}")


def available() -> bool:
    """Whether a forked child may make these mounts here."""
    if not hasattr(os, "fork") or not hasattr(_libc, "unshare"):
        return False
    with tempfile.TemporaryDirectory() as folder:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                private_namespace()
                small_disk(Path(folder), 1 << 20)
                read_only(Path(folder))
                code = 0
            except BaseException:
                pass
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
