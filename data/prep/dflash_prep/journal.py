"""The resume journal of 'dflash-prep regenerate': OUT.journal, append-only jsonl of finished rows.

The first line records the settings ({"journal": {...}}), so a resume with other settings is refused instead of
mixing two kinds of generations. Every finished row is one line {"key": <input line number>, ...} written with
one write() call: a killed run loses only the rows in flight, and a torn last line is cut off on resume."""
import json
import os

from .atomic import OutputError, atomic_output
from .jsonfile import JsonError, parse_json

FSYNC_EVERY = 64
KEPT = "the rows finished before stay in the journal: run the same command again to resume"


class Journal:
    def __init__(self, path: str, header: dict):
        self.path, self.done, self.rows = path, set(), []
        if os.path.exists(path):
            self._load(header)
        else:
            with atomic_output(path) as partial:
                with open(partial, "w", encoding="utf-8") as f:
                    f.write(_dumps({"journal": header}) + "\n")
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.unsynced = 0

    def _load(self, header: dict):
        with open(path := self.path, "rb") as f:
            data = f.read()
        good_end = 0
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            if not raw:
                continue
            try:
                obj = parse_json(raw)
            except JsonError:
                if i == len(lines) - 1:   # the torn last write of a killed run: cut it off
                    break
                raise SystemExit(f"error: {path}:{i + 1}: not valid JSON in the middle of the journal; it was "
                                 "edited or the disk is damaged (delete it to start over)") from None
            if i == 0:
                old = obj.get("journal") if isinstance(obj, dict) else None
                if not isinstance(old, dict):
                    raise SystemExit(f"error: {path}:1: not a journal header; the file is not a dflash-prep journal "
                                     "(delete it to start over)")
                if old != header:
                    diff = sorted(k for k in set(header) | set(old) if old.get(k) != header.get(k))
                    raise SystemExit(f"error: {path} was started with other settings ({', '.join(diff)}): resume "
                                     "with the same command, or delete the journal to start over")
            elif not isinstance(obj, dict) or not isinstance(obj.get("key"), int):
                raise SystemExit(f"error: {path}:{i + 1}: a journal row without an integer 'key'; the journal was "
                                 "edited (delete it to start over)")
            elif obj["key"] in self.done:
                raise SystemExit(f"error: {path}:{i + 1}: key {obj['key']} appears twice")
            else:
                self.done.add(obj["key"])
                self.rows.append(obj)
            good_end += len(raw) + 1
        if good_end < len(data):
            print(f"{path}: cut off a torn last line ({len(data) - good_end} bytes) of a killed run")
            os.truncate(path, good_end)

    def append(self, obj: dict):
        line = memoryview((_dumps(obj) + "\n").encode())
        try:
            while line:   # one write, the whole line, unless the disk fills: then the next write says why
                line = line[os.write(self.fd, line):]
        except OSError as e:
            raise OutputError(self.path, e, KEPT) from None
        self.done.add(obj["key"])
        self.rows.append(obj)
        self.unsynced += 1
        if self.unsynced >= FSYNC_EVERY:
            self.sync()

    def sync(self):
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise OutputError(self.path, e, KEPT) from None
        self.unsynced = 0

    def close(self):
        try:
            self.sync()
        finally:
            os.close(self.fd)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)
