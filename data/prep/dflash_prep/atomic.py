"""All-or-nothing file writes, as lib/core/atomic_file.h does for the C++ tools: write to '<path>.partial',
fsync it, rename it over the final path, fsync the directory. A crash leaves the old file or the whole new one."""
import contextlib
import os


def fsync_path(path: str, directory: bool = False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(partial: str, path: str):
    """fsync partial, rename it to path, fsync path's directory."""
    fsync_path(partial)
    os.replace(partial, path)
    fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)


@contextlib.contextmanager
def atomic_output(path: str):
    """Yields the partial name to write to; on success commits it to path, on an exception removes it."""
    partial = path + ".partial"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(partial):
        os.remove(partial)  # a leftover of a killed run: never half-valid data
    try:
        yield partial
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    commit(partial, path)


def write_text_atomic(path: str, text: str):
    with atomic_output(path) as partial:
        with open(partial, "w", encoding="utf-8") as f:
            f.write(text)
