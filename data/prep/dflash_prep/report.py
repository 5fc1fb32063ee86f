"""dflash-prep report: a dflash_mpi run's metrics.jsonl -> TensorBoard event files and/or a W&B run
(docs/reporting.md). The trainer stays free of Python: this follower reads what it writes.

  dflash-prep report RUN_DIR --tensorboard DIR [--wandb PROJECT [--offline]]   replay the file, then exit
  dflash-prep report RUN_DIR --tensorboard DIR --follow [--pid PID]             tail it live until the run ends

Tags: training records -> train/<key> (acc_by_pos[j-1] -> train/acc_posJ), held-out eval records -> eval/<key
without eval_>, speculative eval records -> eval/spec_<key>; spec_kept_histogram is a histogram (bins centred on
k = tokens kept per verify). A null value (the trainer writes non-finite numbers as null) is written as NaN.

Replays are idempotent: each sink keeps a state file with the last step it holds per record kind, and records at or
below it are skipped (TensorBoard: DIR/dflash_report_state.json, one new event file per invocation that writes
anything; W&B: RUN_DIR/report_state/wandb-PROJECT[-offline].json, which also keeps the W&B run id, so later
invocations and requeued attempts continue the same run). A run started over (run.start_over: the earlier
metrics.jsonl moved to RUN_DIR/superseded/) is a new series: TensorBoard's earlier event files move to
DIR/superseded/<time>/, W&B gets a new run.

--follow ends when --pid PID has exited; without --pid, when RUN_DIR/LOCK (held by the job for its life, removed
at its end) disappears after a live job held it, or after --start-timeout seconds if no job ever held it. SIGTERM
(or Ctrl-C) drains what is written and exits 0; SIGUSR1/SIGUSR2/SIGHUP are ignored (the job's stop signals).
A partially written last line is waited for (never an error); a malformed complete line is reported by line
number and skipped.
"""
import argparse
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import secrets
import signal
import socket
import sys
import time

STATE_VERSION = 1
TB_STATE = "dflash_report_state.json"
WANDB_STATE_DIR = "report_state"
SAVE_EVERY = 1000            # records between state saves during a long replay
HERE = os.path.dirname(os.path.abspath(__file__))
REQUIREMENTS = os.path.normpath(os.path.join(HERE, "..", "requirements-report.txt"))
VENV = os.path.normpath(os.path.join(HERE, "..", ".venv-report"))


def install_hint() -> str:
    root = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
    return (f"bash {root}/mpi_launch/install_prep.sh --report (into data/prep/.venv), or: python3 -m venv {VENV} && "
            f"{VENV}/bin/python -m pip install -r {REQUIREMENTS}; then run this with that environment's python "
            "(the launch scripts look in both; DFLASH_REPORT_PYTHON names another)")


def say(msg: str):
    print(f"report: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- tag mapping

def kind_of(record: dict) -> str:
    """'train' for training records (no "kind"), else the record's kind ("eval", "spec_eval", ...)."""
    k = record.get("kind")
    return "train" if k is None else str(k)


def tag_of(kind: str, key: str) -> str:
    """The tag of a numeric field. train: train/KEY; eval: eval/KEY minus 'eval_'; spec_eval: eval/KEY (its keys
    start with spec_); any other kind K: K/KEY minus 'K_'."""
    if kind == "train":
        return "train/" + key
    if kind == "eval":
        return "eval/" + (key[len("eval_"):] if key.startswith("eval_") else key)
    if kind == "spec_eval":
        return "eval/" + (key if key.startswith("spec_") else "spec_" + key)
    return f"{kind}/" + (key[len(kind) + 1:] if key.startswith(kind + "_") else key)


def _number(v):
    """A JSON value as a float; None when it is not a number. null -> NaN (the trainer's non-finite numbers)."""
    if v is None:
        return math.nan
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v)
    return None


_BY_POS = re.compile(r"^(.*)_by_pos(ition)?$")


def record_values(record: dict):
    """(scalars {tag: float}, histograms {tag: [count per k]}) of one metrics record; "step" and "kind" are not
    values. Lists: *_by_pos / *_by_position[j-1] -> <base>_posJ (block position J, 1-based); a key with
    'histogram' in its name -> a histogram of its counts (index k = value k); other lists -> <tag>/<index>.
    Objects are flattened with '/'; strings are not values."""
    kind = kind_of(record)
    scalars, hists = {}, {}

    def add(tag, v):
        if isinstance(v, dict):
            for k2, v2 in v.items():
                add(f"{tag}/{k2}", v2)
            return
        if isinstance(v, list):
            return
        x = _number(v)
        if x is not None:
            scalars[tag] = x

    for key, v in record.items():
        if key in ("step", "kind"):
            continue
        tag = tag_of(kind, key)
        if isinstance(v, list):
            nums = [_number(x) for x in v]
            if "histogram" in key:
                if all(x is not None and math.isfinite(x) for x in nums):
                    hists[tag] = nums
                continue
            m = _BY_POS.match(tag)
            for i, x in enumerate(nums):
                if x is not None:
                    scalars[f"{m.group(1)}_pos{i + 1}" if m else f"{tag}/{i}"] = x
        else:
            add(tag, v)
    return scalars, hists


def histogram_edges(counts):
    """Bin edges of a counts-by-value histogram: bin k is [k - 0.5, k + 0.5]."""
    return [k - 0.5 for k in range(len(counts) + 1)]


# ------------------------------------------------------------------------------------------------ reading the file

def line_hash(raw: bytes) -> str:
    return hashlib.sha256(raw.strip()).hexdigest()[:16]


def started_over(run_dir: str, first: str) -> bool:
    """Whether run.start_over moved the metrics.jsonl whose first line hashes to `first` to
    RUN_DIR/superseded/<time>/ (lib/state/out_dir_guard.h): RUN_DIR's metrics.jsonl is then a new run's."""
    for path in glob.glob(os.path.join(run_dir, "superseded", "*", "metrics.jsonl")):
        try:
            with open(path, "rb") as f:
                if line_hash(f.readline()) == first:
                    return True
        except OSError:
            pass
    return False


def utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


class MetricsTail:
    """Reads metrics.jsonl incrementally: complete lines only (an unterminated last line waits for its newline),
    from the start again when the file is replaced or shrinks (the trainer rewrites it atomically when an attempt
    resumes). Malformed complete lines are reported as FILE:LINE and skipped."""

    def __init__(self, path: str):
        self.path = path
        self.f = None
        self.ino = None
        self.pos = 0
        self.buf = b""
        self.lineno = 0
        self.malformed = 0
        self.first = None   # line_hash of the file's first line: which series it is (Sink.check_series)

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return False
        if self.f:
            self.f.close()
        self.f, self.ino, self.pos, self.buf, self.lineno = f, os.fstat(f.fileno()).st_ino, 0, b"", 0
        self.first = None
        return True

    def poll(self, final: bool = False):
        """The records of the lines completed since the last call: [(line number, record)]. final: the writer has
        ended, so an unterminated last line that is a whole record counts too (else it is reported)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and (self.f is None or st.st_ino != self.ino or st.st_size < self.pos):
            if self.f is not None:
                say(f"{self.path} was rewritten (an attempt resumed, or the file was replaced): reading it again "
                    "from the start; steps already written are skipped")
            self._open()
        if self.f is None:
            return []
        self.f.seek(self.pos)
        data = self.f.read()
        self.pos += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for raw in lines:
            self.lineno += 1
            if self.lineno == 1:
                self.first = line_hash(raw)
            rec = self._parse(raw, self.lineno)
            if rec is not None:
                out.append((self.lineno, rec))
        if final and self.buf.strip():
            rec = self._parse(self.buf, self.lineno + 1, quiet=True)
            if rec is not None:
                self.lineno += 1
                out.append((self.lineno, rec))
            else:
                say(f"{self.path}:{self.lineno + 1}: incomplete last line ({len(self.buf)} bytes, no newline): "
                    "not read (the trainer was writing it when it stopped)")
            self.buf = b""
        return out

    def _parse(self, raw: bytes, lineno: int, quiet: bool = False):
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return None
        try:
            rec = json.loads(text)
            why = None
            if not isinstance(rec, dict):
                why = "not a JSON object"
            elif not isinstance(rec.get("step"), int) or isinstance(rec.get("step"), bool):
                why = 'no integer "step"'
        except ValueError as e:
            why = f"not JSON ({e})"
        if why is None:
            return rec
        if not quiet:
            self.malformed += 1
            say(f"{self.path}:{lineno}: skipped, not a metrics record: {why}: {text[:80]!r}")
        return None


# ------------------------------------------------------------------------------------------------------ sink state

def write_json_atomic(path: str, obj):
    tmp = f"{path}.partial.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SinkError(Exception):
    pass


class Sink:
    """A destination with a state file: the last step it holds per record kind. Holds an flock on STATE.lock for
    its life: two followers writing one destination would duplicate steps."""
    name = "sink"

    def __init__(self, state_path: str, metrics_path: str, restart: bool):
        self.state_path = state_path
        os.makedirs(os.path.dirname(state_path), exist_ok=True)
        self._lock = open(state_path + ".lock", "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise SinkError(f"another 'dflash-prep report' writes {self.describe()} (it holds {state_path}.lock); "
                            "stop it first (two followers would write every step twice)")
        except OSError as e:   # a file system without flock: go on without the guard
            say(f"cannot lock {state_path}.lock ({e.strerror}): two followers of one destination would not be caught")
        self.state = {}
        if not restart and os.path.exists(state_path):
            try:
                with open(state_path) as f:
                    self.state = json.load(f)
            except (OSError, ValueError) as e:
                self._lock.close()
                raise SinkError(f"cannot read {state_path} ({e}): fix or remove it (removing it writes every step "
                                "again)")
        self.state.setdefault("version", STATE_VERSION)
        self.state.setdefault("last_step", {})
        old = self.state.get("metrics")
        if old and old != metrics_path:
            say(f"{self.describe()} was written from {old}; now from {metrics_path} (its steps are skipped)")
        self.state["metrics"] = metrics_path
        self.written = self.skipped = 0
        self.dirty = False

    def describe(self) -> str:
        return self.name

    def wants(self, kind: str, step: int) -> bool:
        return step > self.state["last_step"].get(kind, 0)

    def add(self, kind: str, step: int, scalars: dict, hists: dict):
        if not self.wants(kind, step):
            self.skipped += 1
            return
        self.write(kind, step, scalars, hists)
        self.state["last_step"][kind] = step
        self.written += 1
        self.dirty = True

    def check_series(self, first: str, run_dir: str):
        """The file's first line says which series it is. The one this destination holds (a resumed attempt keeps
        the records before its checkpoint verbatim): nothing to do. Another, and RUN_DIR/superseded/ holds the
        earlier file (run.start_over): a new series, new_series(). Another, for no visible reason (an attempt that
        found no checkpoint re-runs step 1, with other timings): the same series, steps it holds are skipped."""
        known = self.state.get("first_line")
        if known != first:
            if known is not None and started_over(run_dir, known):
                say(f"{self.describe()}: {run_dir} was started over (run.start_over moved the earlier metrics.jsonl "
                    f"to {run_dir}/superseded/): {self.new_series()}")
                self.state["last_step"] = {}
            elif known is not None:
                say(f"{self.describe()}: the first record of {run_dir}/metrics.jsonl is not the one it was written "
                    "from (an attempt that found no checkpoint re-ran step 1?): steps it holds are skipped; for "
                    "another run use another destination or --restart")
            self.state["first_line"] = first
            self.dirty = True

    def new_series(self) -> str:
        """Sets the destination up for a new run in RUN_DIR; returns what it did, for the message."""
        raise NotImplementedError

    def commit(self):
        """Makes what was written durable, then records it in the state file."""
        if not self.dirty:
            return
        self.flush()
        write_json_atomic(self.state_path, self.state)
        self.dirty = False

    def close(self):
        self.commit()
        self.finish()
        self._lock.close()

    def abandon(self):
        """After a failure: no state update, just let go of the lock."""
        try:
            self.finish()
        except Exception:
            pass
        self._lock.close()

    # per sink
    def write(self, kind, step, scalars, hists):
        raise NotImplementedError

    def flush(self):
        pass

    def finish(self):
        pass


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, logdir: str, metrics_path: str, restart: bool):
        from tensorboard.compat.proto import event_pb2, summary_pb2   # noqa: F401 (fails early when missing)
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.logdir = os.path.abspath(logdir)
        self._pb = (event_pb2, summary_pb2)
        self._writer_class = EventFileWriter
        self._writer = None
        super().__init__(os.path.join(self.logdir, TB_STATE), metrics_path, restart)
        if restart and any("tfevents" in n for n in os.listdir(self.logdir)):
            say(f"--restart: {self.logdir} already holds event files; TensorBoard shows their steps too (remove "
                "them for a clean series)")

    def describe(self):
        return f"TensorBoard {self.logdir}"

    def new_series(self):
        if self._writer:
            self._writer.close()
            self._writer = None
        events = [n for n in os.listdir(self.logdir) if "tfevents" in n]
        if not events:
            return "a new series"
        aside = os.path.join(self.logdir, "superseded", utc_stamp())
        os.makedirs(aside, exist_ok=True)
        for n in events:
            os.replace(os.path.join(self.logdir, n), os.path.join(aside, n))
        return f"the earlier run's event files moved to {aside} (TensorBoard shows it as a run of its own)"

    def write(self, kind, step, scalars, hists):
        event_pb2, summary_pb2 = self._pb
        values = [summary_pb2.Summary.Value(tag=t, simple_value=x) for t, x in scalars.items()]
        for t, counts in hists.items():
            num = sum(counts)
            nonzero = [k for k, c in enumerate(counts) if c > 0]
            lo, hi = (nonzero[0] - 0.5, nonzero[-1] + 0.5) if nonzero else (0.0, 0.0)
            h = summary_pb2.HistogramProto(
                min=lo, max=hi, num=num, sum=sum(k * c for k, c in enumerate(counts)),
                sum_squares=sum(k * k * c for k, c in enumerate(counts)),
                bucket_limit=histogram_edges(counts)[1:], bucket=counts)
            values.append(summary_pb2.Summary.Value(tag=t, histo=h))
        if self._writer is None:   # no event file for an invocation that writes nothing
            self._writer = self._writer_class(self.logdir)
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                               summary=summary_pb2.Summary(value=values)))

    def flush(self):
        if self._writer:
            self._writer.flush()

    def finish(self):
        if self._writer:
            self._writer.close()


def new_run_id() -> str:
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s) or "_"


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, project: str, offline: bool, run_dir: str, wandb_dir: str, metrics_path: str,
                 restart: bool, state_dir: str, name: str, entity: str):
        import wandb   # noqa: F401 (fails early when missing)
        self.project, self.offline, self.run_dir, self.entity = project, offline, run_dir, entity
        self.wandb_dir = os.path.abspath(wandb_dir)
        self.run_name = name
        self._run = None
        mode = "-offline" if offline else ""
        super().__init__(os.path.join(state_dir, f"wandb-{_safe_name(project)}{mode}.json"), metrics_path, restart)
        if "run_id" not in self.state:
            self.state["run_id"] = new_run_id()
            write_json_atomic(self.state_path, self.state)

    def describe(self):
        return f"W&B project {self.project}" + (" (offline)" if self.offline else "")

    def new_series(self):
        if self._run is not None:
            self._run.finish()
            self._run = None
        old, self.state["run_id"] = self.state["run_id"], new_run_id()
        return f"a new W&B run {self.state['run_id']} (the earlier one, {old}, stays as it is)"

    def _start(self):
        import wandb
        os.makedirs(self.wandb_dir, exist_ok=True)
        config = resolved_config(self.run_dir)   # written at the job's start: there by the first record
        run_cfg = config.get("run") if isinstance(config, dict) else None
        name = self.run_name or (str(run_cfg.get("name")) if isinstance(run_cfg, dict) and run_cfg.get("name")
                                 else None)
        settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True, save_code=False,
                                  x_save_requirements=False, silent=True)
        try:
            self._run = wandb.init(project=self.project, entity=self.entity or None, id=self.state["run_id"],
                                   resume="allow", mode="offline" if self.offline else None, dir=self.wandb_dir,
                                   name=name, config=config, settings=settings)
        except Exception as e:   # wandb raises its own types (no API key, no network, ...)
            raise SinkError(f"W&B init failed: {e}" + ("" if self.offline else
                            "; set WANDB_API_KEY (wandb login), or use --offline and 'wandb sync' later"))
        say(f"W&B run {self.state['run_id']} in {self.wandb_dir}" + (" (offline)" if self.offline else ""))

    def write(self, kind, step, scalars, hists):
        import wandb
        if self._run is None:
            self._start()
        data = dict(scalars)
        for t, counts in hists.items():
            data[t] = wandb.Histogram(np_histogram=(counts, histogram_edges(counts)))
        self._run.log(data, step=step)

    def finish(self):
        if self._run is not None:
            self._run.finish()
            if self.offline:
                say(f"W&B offline run in {self.wandb_dir}/wandb: upload it with 'wandb sync "
                    f"{self.wandb_dir}/wandb/offline-run-*-{self.state['run_id']}'")


# ---------------------------------------------------------------------------------------------------- run liveness

def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie (exited, not yet reaped by its parent) has ended
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def lock_holder(run_dir: str):
    """None when RUN_DIR/LOCK is absent; else (live, description). live: held by a process that runs (on this
    host: its pid exists; on another host: assumed, flock cannot be checked from here)."""
    try:
        with open(os.path.join(run_dir, "LOCK")) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return (True, "an unreadable LOCK")
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    host, pid = fields.get("host"), fields.get("pid", "")
    if not host or not pid.isdigit():
        return (True, "a LOCK being written")
    if host != socket.gethostname():
        return (True, f"host {host}, pid {pid}")
    return (pid_alive(int(pid)), f"pid {pid}")


class Stop:
    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        self.signal = signal.Signals(signum).name


# ---------------------------------------------------------------------------------------------------------- command

def add_arguments(p):
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's out_dir (run.out_dir), or its metrics.jsonl")
    p.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files into DIR")
    p.add_argument("--wandb", metavar="PROJECT", help="log to the W&B project PROJECT (WANDB_API_KEY, WANDB_ENTITY "
                   "as wandb reads them)")
    p.add_argument("--offline", action="store_true", help="W&B offline mode: write the run under --wandb-dir, "
                   "upload later with 'wandb sync'")
    p.add_argument("--wandb-dir", metavar="DIR", help="W&B's folder (its wandb/ goes inside; default $WANDB_DIR, "
                   "else RUN_DIR)")
    p.add_argument("--wandb-name", metavar="NAME", help="W&B run name (default run.name from RUN_DIR/config.resolved.yaml)")
    p.add_argument("--wandb-entity", metavar="ENTITY", help="W&B entity (default $WANDB_ENTITY / your default)")
    p.add_argument("--state-dir", metavar="DIR", help="where the W&B sink keeps its state (default RUN_DIR/"
                   f"{WANDB_STATE_DIR}); TensorBoard's is always in its DIR")
    p.add_argument("--follow", action="store_true", help="tail the file live until the run ends (see --pid)")
    p.add_argument("--pid", type=int, help="with --follow: the run ends when this process exits (the launch "
                   "scripts pass mpirun's / the batch script's pid)")
    p.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="with --follow: seconds between "
                   "reads (default 1)")
    p.add_argument("--start-timeout", type=float, default=600.0, metavar="SECONDS", help="with --follow and no "
                   "--pid: give up when no job has held RUN_DIR/LOCK for this long (default 600)")
    p.add_argument("--restart", action="store_true", help="forget which steps the destinations hold (W&B: a new "
                   "run) and write every record again")


def add_parser(subparsers):
    p = subparsers.add_parser("report", help="metrics.jsonl of a run -> TensorBoard / W&B (replay, or --follow "
                              "live)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def resolved_config(run_dir: str):
    """RUN_DIR/config.resolved.yaml (written by the job at its start) as a dict; None when absent or unreadable."""
    try:
        import yaml
        with open(os.path.join(run_dir, "config.resolved.yaml")) as f:
            cfg = yaml.safe_load(f)
        return cfg if isinstance(cfg, dict) else None
    except Exception:
        return None


def make_sinks(args, run_dir: str, metrics: str):
    sinks = []
    try:
        if args.tensorboard:
            try:
                import tensorboard  # noqa: F401
            except ImportError:
                raise SinkError(f"--tensorboard needs the 'tensorboard' package, not in {sys.executable}; "
                                f"install: {install_hint()}")
            sinks.append(TensorBoardSink(args.tensorboard, metrics, args.restart))
        if args.wandb:
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise SinkError(f"--wandb needs the 'wandb' package, not in {sys.executable}; install: "
                                f"{install_hint()}")
            wandb_dir = args.wandb_dir or os.environ.get("WANDB_DIR") or run_dir
            sinks.append(WandbSink(args.wandb, args.offline, run_dir, wandb_dir, metrics, args.restart,
                                   os.path.abspath(args.state_dir or os.path.join(run_dir, WANDB_STATE_DIR)),
                                   args.wandb_name, args.wandb_entity))
    except SinkError:
        for s in sinks:
            s.close()
        raise
    return sinks


def run(args) -> int:
    if not args.tensorboard and not args.wandb:
        say("nothing to do: give --tensorboard DIR and/or --wandb PROJECT")
        return 2
    if args.pid is not None and not args.follow:
        say("--pid only means something with --follow")
        return 2
    if args.poll <= 0 or args.start_timeout < 0:
        say("--poll must be > 0 and --start-timeout >= 0 (seconds)")
        return 2
    if args.offline and not args.wandb:
        say("--offline is W&B's: give --wandb PROJECT")
        return 2
    path = os.path.abspath(args.run_dir)
    if os.path.isdir(path) or not path.endswith(".jsonl"):
        run_dir, metrics = path, os.path.join(path, "metrics.jsonl")
    else:
        run_dir, metrics = os.path.dirname(path), path
    if not args.follow and not os.path.isfile(metrics):
        say(f"no {metrics}: give the run's out_dir (run.out_dir of its config)")
        return 1
    stop = Stop()
    if args.follow:   # before the (slow) imports of the sinks: a SIGTERM then still drains the file
        signal.signal(signal.SIGTERM, stop)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # not when started with SIGINT ignored
            signal.signal(signal.SIGINT, stop)
        for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
    try:
        sinks = make_sinks(args, run_dir, metrics)
    except SinkError as e:
        say(str(e))
        return 1
    tail = MetricsTail(metrics)
    counts = {}
    failed = []
    checked = [None]   # the first-line hash the sinks were last checked against

    def drop(s, e):
        say(f"{s.describe()}: {e}; it gets nothing more")
        failed.append(s)
        sinks.remove(s)
        s.abandon()

    def process(batch):
        if tail.first is not None and tail.first != checked[0]:
            checked[0] = tail.first
            for s in list(sinks):
                try:
                    s.check_series(tail.first, run_dir)
                except Exception as e:
                    drop(s, e)
        for lineno, rec in batch:
            kind, step = kind_of(rec), rec["step"]
            scalars, hists = record_values(rec)
            counts[kind] = counts.get(kind, 0) + 1
            for s in list(sinks):
                try:
                    s.add(kind, step, scalars, hists)
                    if s.dirty and s.written % SAVE_EVERY == 0:
                        s.commit()
                except Exception as e:   # SinkError, a full disk, wandb's own errors: the other sinks go on
                    drop(s, e)
        for s in list(sinks):
            try:
                s.commit()
            except Exception as e:
                drop(s, e)

    reason = None
    if args.follow:
        targets = ", ".join(s.describe() for s in sinks)
        say(f"following {metrics} into {targets}" + (f" until process {args.pid} exits" if args.pid is not None else
            " until the job holding RUN_DIR/LOCK ends"))
        started, seen_live = time.monotonic(), False
        if args.pid is not None and not pid_alive(args.pid):
            reason = f"process {args.pid} is not running"
        while reason is None and sinks:
            process(tail.poll())
            if stop.signal:
                reason = f"stopped by {stop.signal}"
                break
            if args.pid is not None:
                if not pid_alive(args.pid):
                    reason = f"process {args.pid} exited"
                    break
            else:
                holder = lock_holder(run_dir)
                if holder and holder[0]:
                    seen_live = True
                elif seen_live:
                    reason = f"{run_dir}/LOCK released: the job ended"
                    break
                elif time.monotonic() - started > args.start_timeout:
                    reason = (f"no job held {run_dir}/LOCK within {args.start_timeout:.0f} s (--start-timeout); "
                              "give --pid to follow a job that is not started yet")
                    break
            deadline = time.monotonic() + args.poll
            while time.monotonic() < deadline and not stop.signal:
                time.sleep(min(0.1, args.poll))
    if sinks:
        process(tail.poll(final=True))
    for s in sinks:
        try:
            s.close()
        except Exception as e:   # a sink's last flush must not hide the others' summaries
            say(f"{s.describe()}: closing failed: {e}")
            failed.append(s)
    read = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"
    say(f"{metrics}: records read: {read}" + (f"; {tail.malformed} malformed line(s) skipped" if tail.malformed
                                               else "") + (f"; {reason}" if reason else ""))
    for s in sinks:
        say(f"{s.describe()}: wrote {s.written} record(s), skipped {s.skipped} it already held")
    for s in failed:
        say(f"{s.describe()}: FAILED (see above)")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dflash-prep report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
