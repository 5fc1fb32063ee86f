"""All-or-nothing file writes, as lib/core/atomic_file.h does for the C++ tools: write to '<path>.partial',
fsync it, rename it over the final path, fsync the directory. A crash leaves the old file or the whole new one.

A failed write (a full disk, a quota, a file size limit) raises OutputError, which names the final file and the
system's reason; the partial file is removed. The command-line entry point prints it and exits 1."""
import contextlib
import errno
import os


class OutputError(Exception):
    """An output file cannot be written. str(): the file, the system's reason and what to do."""

    def __init__(self, path: str, err, outcome: str = "nothing was written"):
        code = err.errno if isinstance(err, OSError) and err.errno else None
        reason = (err.strerror if isinstance(err, OSError) and err.strerror else str(err)) or type(err).__name__
        hint = {errno.ENOSPC: "free space on that disk or write elsewhere",
                errno.EDQUOT: "the disk quota is used up: free space or write elsewhere",
                errno.EFBIG: "the file size limit (ulimit -f) or the file system's largest file is reached",
                errno.EACCES: "no permission to write there", errno.EROFS: "the file system is read-only"}
        self.path = path
        super().__init__(f"cannot write {path}: {reason}" + (f" (errno {code})" if code else "")
                         + (f"; {hint[code]}" if code in hint else "") + f"; {outcome}")


def fsync_path(path: str, directory: bool = False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(partial: str, path: str):
    """fsync partial, rename it to path, fsync path's directory."""
    try:
        fsync_path(partial)
        os.replace(partial, path)
        fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)
    except OSError as e:
        raise OutputError(path, e) from None


def check_output_path(path: str, option: str, inputs=()):
    """Exit before any work when path cannot become an output file: it is a directory, its folder is a file, or
    it is one of the inputs (writing it would destroy the input)."""
    if os.path.isdir(path):
        raise SystemExit(f"error: {option} {path} is a directory; give a file name in it, e.g. "
                         f"{os.path.join(path, 'out' + (os.path.splitext(path)[1] or '.h5'))}")
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise SystemExit(f"error: {option} {path}: {parent} is a file, not a folder")
    for i in inputs:
        if os.path.exists(path) and os.path.exists(i) and os.path.samefile(path, i):
            raise SystemExit(f"error: {option} {path} is also an input file; writing it would destroy the input")


@contextlib.contextmanager
def atomic_output(path: str):
    """Yields the partial name to write to; on success commits it to path, on an exception removes it.
    An OSError of the body writing the partial file becomes OutputError naming path."""
    partial = path + ".partial"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if os.path.exists(partial):
            os.remove(partial)  # a leftover of a killed run: never half-valid data
    except OSError as e:
        raise OutputError(path, e) from None
    try:
        yield partial
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(partial)
        if isinstance(e, OSError) and e.filename in (None, partial):   # not an input file's read error
            raise OutputError(path, e) from None
        raise
    try:
        commit(partial, path)
    except OutputError:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise


def write_text_atomic(path: str, text: str):
    with atomic_output(path) as partial:
        with open(partial, "w", encoding="utf-8") as f:
            f.write(text)
