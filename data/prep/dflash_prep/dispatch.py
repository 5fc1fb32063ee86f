"""Rows spread over several servers ('regenerate --server A --server B ...'): one shared queue of rows in input
order, at most `per_server` rows in flight on each server; a row goes to the live server with the fewest rows in
flight (the first one on ties), so equal servers share the work evenly and a slow one gets less.

When a server fails:
  - ServerDown (unreachable, or failing after its retries): the server is taken out for the rest of the run and
    its rows go back to the front of the queue, for the others. When no server is left, AllServersDown.
  - BadAnswer (unusable answers after its retries): the row is tried on a live server that has not tried it yet;
    when every live server has, the row has failed (on_failed, with each server's fault).
  - Reject (the server refuses the prompt, e.g. HTTP 400): the row is refused (on_reject); another server would
    refuse it too.
Where a row was generated does not matter for the output: the caller writes rows in input order."""
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
import sys

from .client import BadAnswer, ServerDown
from .rows import Reject


class AllServersDown(Exception):
    pass


class Server:
    def __init__(self, url: str, client):
        self.url, self.client = url, client
        self.alive = True
        self.in_flight = 0
        self.rows = 0      # rows generated here


class Dispatcher:
    def __init__(self, servers: list, per_server: int, work):
        """work(client, row) -> result; raises Reject, BadAnswer or ServerDown."""
        self.servers, self.per_server, self.work = servers, per_server, work
        self.pool = ThreadPoolExecutor(max_workers=per_server * len(servers))

    def _pick(self, tried: set):
        """The server for a row (None: all eligible ones are busy); raises LookupError when none is eligible."""
        eligible = [s for s in self.servers if s.alive and s not in tried]
        if not eligible:
            raise LookupError
        free = [s for s in eligible if s.in_flight < self.per_server]
        return min(free, key=lambda s: s.in_flight) if free else None

    def run(self, rows, on_done, on_reject, on_failed, on_tick, tick_seconds: float = 2.0):
        todo = deque(rows)
        tried, faults = {}, {}          # row.line -> servers that gave a bad answer, their messages
        pending = {}                    # future -> (row, server)
        while todo or pending:
            while todo:
                row = todo[0]
                try:
                    server = self._pick(tried.get(row.line, set()))
                except LookupError:
                    todo.popleft()
                    if not any(s.alive for s in self.servers):
                        todo.appendleft(row)
                        break
                    tried.pop(row.line, None)
                    on_failed(row, faults.pop(row.line))
                    continue
                if server is None:
                    break
                todo.popleft()
                server.in_flight += 1
                pending[self.pool.submit(self.work, server.client, row)] = (row, server)
            if not pending:
                if todo:   # rows left, no live server
                    raise AllServersDown
                break
            finished, _ = wait(pending, timeout=tick_seconds, return_when=FIRST_COMPLETED)
            for fut in finished:
                row, server = pending.pop(fut)
                server.in_flight -= 1
                try:
                    result = fut.result()
                except Reject as r:
                    on_reject(row, r)
                except BadAnswer as e:
                    tried.setdefault(row.line, set()).add(server)
                    faults.setdefault(row.line, []).append(str(e))
                    todo.appendleft(row)
                except ServerDown as e:
                    if server.alive:
                        server.alive = False
                        left = sum(s.alive for s in self.servers)
                        print(f"warning: server {server.url} failed: {e}; "
                              + (f"its rows go to the {left} other live server(s)" if left else "no server left"),
                              file=sys.stderr, flush=True)
                    todo.appendleft(row)
                else:
                    server.rows += 1
                    on_done(row, result)
            on_tick()

    def shutdown(self, wait_for_requests: bool):
        self.pool.shutdown(wait=wait_for_requests, cancel_futures=not wait_for_requests)
