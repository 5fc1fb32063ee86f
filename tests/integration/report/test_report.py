"""dflash-prep report end to end (docs/reporting.md), one case per ctest test (tests/integration/report/report.sh):

  tensorboard  replay a metrics.jsonl in the trainer's format (training, eval and spec_eval records, a null, a
               malformed line, a torn last line) and read the event files back with TensorBoard's EventAccumulator:
               the documented tags, every step once, float32 values, the kept-token histogram's counts; a second
               replay writes nothing; after the file grows a replay writes only the new steps; a re-run step 1
               (resume at step 0) is skipped; run.start_over (RUN_DIR/superseded/) starts a new series and moves
               the earlier event files to TB/superseded/<time>/
  wandb        the same in W&B offline mode, read back from the offline run's .wandb transaction log: the values
               (exact), the histogram, one W&B run id across invocations and no step twice; run.start_over: a new
               W&B run
  follow       --follow without --pid: a writer appends records over time (a half line among them), rewrites the
               file as a resumed attempt does, the follower picks everything up live and ends by itself once the
               job's LOCK is released
  follow_pid   --follow --pid: ends when the process exits (a zombie counts as exited); SIGUSR1 is ignored;
               SIGTERM drains and exits 0; --start-timeout ends a follow that never sees a job
  launcher     mpi_launch/run_local.sh with a stub dflash_mpi / mpirun: the follower starts when report.* is set,
               mpirun keeps the script's pid and exit status, the follower ends by itself; no Python environment
               or a binary without report.* keys: a warning / nothing, the job's exit status unchanged
  sbatch       mpi_launch/slurm/*.sbatch with stub srun / mpirun / scontrol: the follower runs beside the job and is
               stopped and waited for after it; SIGUSR1 to the batch script still reaches mpirun
  trainer      the real tiny job (run_local.sh -np 8, 3 steps) with report.tensorboard set: the event file holds
               exactly metrics.jsonl's values (SKIP when the built dflash_mpi has no report.* keys)
"""
import argparse
import glob
import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

B = 8   # drafter.block_size of the synthetic records

TRAIN_TAGS = (["train/" + k for k in ("steps_averaged", "loss", "ce", "kl", "cap", "weight_sum", "acc")]
              + [f"train/acc_pos{j}" for j in range(1, B)]
              + ["train/" + k for k in ("topk_acc", "tau", "lr", "grad_norm", "tokens_per_s", "wait_share",
                                        "compute_share", "positions", "elapsed_s")])
EVAL_TAGS = (["eval/" + k for k in ("loss", "ce", "kl", "cap", "weight_sum", "acc")]
             + [f"eval/acc_pos{j}" for j in range(1, B)]
             + ["eval/" + k for k in ("topk_acc", "tau", "sequences", "tokens", "positions", "seconds")])
SPEC_TAGS = (["eval/spec_" + k for k in ("prompts", "block_size", "tau", "generated_tokens", "verify_forwards",
                                          "target_forwards", "rollback_forwards", "target_forwards_per_token",
                                          "tokens_per_second", "seconds")]
             + [f"eval/spec_acceptance_pos{j}" for j in range(1, B)] + ["eval/spec_drafter_seconds"])
HIST_TAG = "eval/spec_kept_histogram"


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


# ------------------------------------------------------------------------- records in the trainer's format
# field names and order: lib/report/progress.cpp (ProgressInterval::record), lib/eval/heldout_eval.cpp
# (heldout_record), lib/eval/spec_eval.cpp (spec_eval_record over SpecSummary::to_json, lib/eval/spec_decode.cpp)

def train_record(step, shift=0.0):
    loss = 7.0 - 0.0137 * step + shift
    return {"step": step, "steps_averaged": 1, "loss": loss, "ce": loss * 0.9, "kl": 0.8 / step, "cap": 0.02 + shift,
            "weight_sum": 689.413677752018 + step, "acc": 0.01 * step,
            "acc_by_pos": [0.1 / (j + step) for j in range(1, B)], "topk_acc": 0.013417521704814523 * step,
            "tau": 1.0 + step / 37.0, "lr": 0.01 * min(1.0, step / 3.0), "grad_norm": 0.5006785398812184 / step,
            "tokens_per_s": 5907.445307684424 + step, "wait_share": 0.5017144196661034,
            "compute_share": 0.12839874392162742, "positions": 1267 + step, "elapsed_s": 0.1595 * step}


def eval_record(step):
    return {"step": step, "kind": "eval", "eval_loss": 6.050937432708609 - step / 100, "eval_ce": 5.713075440133842,
            "eval_kl": 0.669569289700369, "eval_cap": 0.03077347724580618, "eval_weight_sum": 345.9045543074608,
            "eval_acc": 0.01726844583987441, "eval_acc_by_pos": [0.02 * j + step / 1000 for j in range(1, B)],
            "eval_topk_acc": 0.12087912087912088, "eval_tau": 1.0208333333333333 + step / 1000,
            "eval_sequences": 6, "eval_tokens": 467, "eval_positions": 637, "eval_seconds": 0.05721545800042804}


def spec_record(step, hist=(0, 63, 3, 0, 2, 0, 0, 0, 1)):
    verifies = sum(hist)
    kept = sum(k * c for k, c in enumerate(hist))
    return {"step": step, "kind": "spec_eval", "spec_prompts": 3, "spec_block_size": B, "spec_tau": kept / verifies,
            "spec_generated_tokens": kept + 3, "spec_verify_forwards": verifies, "spec_target_forwards": verifies + 3,
            "spec_rollback_forwards": 0, "spec_target_forwards_per_token": (verifies + 3) / (kept + 3),
            "spec_tokens_per_second": 527.2536187154717, "spec_seconds": 0.13655667300190544,
            "spec_kept_histogram": list(hist),
            "spec_acceptance_by_position": [sum(hist[j + 1:]) / verifies for j in range(1, B)],
            "spec_drafter_seconds": 0.012486515013733879}


def line(rec):
    return json.dumps(rec, separators=(",", ":")) + "\n"


def expected_values(rec):
    """{tag: value} of one record per the documented mapping (docs/reporting.md), the histogram left out."""
    kind = rec.get("kind", "train")
    out = {}
    for k, v in rec.items():
        if k in ("step", "kind") or k == "spec_kept_histogram":
            continue
        if kind == "train":
            tag = "train/" + k
        elif kind == "eval":
            tag = "eval/" + k[len("eval_"):]
        else:
            tag = "eval/" + k
        if isinstance(v, list):
            base = tag.replace("_by_position", "").replace("_by_pos", "")
            for i, x in enumerate(v):
                out[f"{base}_pos{i + 1}"] = math.nan if x is None else float(x)
        else:
            out[tag] = math.nan if v is None else float(v)
    return out


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


# ----------------------------------------------------------------------------------------------- the follower

class Ctx:
    def __init__(self, args):
        self.src, self.build, self.work, self.py = args.src, args.build, args.work, args.python
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.env = dict(os.environ, PYTHONPATH=os.path.join(self.src, "data", "prep"), WANDB_SILENT="true")

    def report_cmd(self, *args):
        return [self.py, "-m", "dflash_prep.report", *args]

    def report(self, *args, expect_rc=0, env=None):
        r = subprocess.run(self.report_cmd(*args), env=env or self.env, capture_output=True, text=True, timeout=120)
        sys.stderr.write(r.stderr)
        check(r.returncode == expect_rc, f"dflash-prep report {' '.join(args)}: exit {r.returncode}, expected "
              f"{expect_rc}")
        return r.stderr

    def popen(self, *args, log):
        return subprocess.Popen(self.report_cmd(*args), env=self.env, stdout=subprocess.DEVNULL,
                                stderr=open(log, "w"))


def read_tb(logdir):
    """(scalars {tag: [(step, value)]}, histograms {tag: [(step, HistogramValue)]}) through TensorBoard's reader."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]}
    hists = {t: [(e.step, e.histogram_value) for e in acc.Histograms(t)] for t in tags["histograms"]}
    return scalars, hists


def check_tb_scalars(scalars, records, what):
    """Every tag of every record at its step exactly once with the float32 of its value, and no other tag."""
    want = {}
    for rec in records:
        for tag, v in expected_values(rec).items():
            want.setdefault(tag, []).append((rec["step"], v))
    check(set(scalars) == set(want), f"{what}: tags differ: extra {sorted(set(scalars) - set(want))}, missing "
          f"{sorted(set(want) - set(scalars))}")
    for tag, pts in want.items():
        got = scalars[tag]
        check([s for s, _ in got] == [s for s, _ in pts], f"{what}: {tag}: steps {[s for s, _ in got]}, expected "
              f"{[s for s, _ in pts]}")
        for (s, g), (_, w) in zip(got, pts):
            check(same(g, f32(w)), f"{what}: {tag} at step {s}: {g!r}, expected float32({w!r}) = {f32(w)!r}")


def check_tb_histogram(hist, step, counts, what):
    check(list(hist.bucket) == [float(c) for c in counts], f"{what}: histogram at {step}: buckets {hist.bucket}, "
          f"expected {counts}")
    check(list(hist.bucket_limit) == [k + 0.5 for k in range(len(counts))], f"{what}: bucket limits "
          f"{hist.bucket_limit}")
    check(hist.num == sum(counts) and hist.sum == sum(k * c for k, c in enumerate(counts)) and
          hist.sum_squares == sum(k * k * c for k, c in enumerate(counts)), f"{what}: histogram totals {hist}")
    nonzero = [k for k, c in enumerate(counts) if c]
    check(hist.min == nonzero[0] - 0.5 and hist.max == nonzero[-1] + 0.5, f"{what}: min/max {hist.min} {hist.max}")


def add_parser_works(ctx):
    """The subcommand's registration pair: add_parser(subparsers) gives args whose func is run."""
    sys.path.insert(0, os.path.join(ctx.src, "data", "prep"))
    from dflash_prep import report
    p = argparse.ArgumentParser(prog="dflash-prep")
    sub = p.add_subparsers(dest="command", required=True)
    report.add_parser(sub)
    a = p.parse_args(["report", "RUN", "--tensorboard", "TB", "--follow", "--pid", "7"])
    check(a.func is report.run and a.run_dir == "RUN" and a.tensorboard == "TB" and a.follow and a.pid == 7,
          f"add_parser: {a}")


def case_tensorboard(ctx):
    add_parser_works(ctx)
    run, tb = os.path.join(ctx.work, "run"), os.path.join(ctx.work, "tb")
    os.makedirs(run)
    recs = [train_record(s) for s in range(1, 5)]
    recs[2]["grad_norm"] = None   # the trainer writes a non-finite number as null
    recs += [eval_record(4), spec_record(4)]
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        for r in recs[:2]:
            f.write(line(r))
        f.write('{"step": 2.5, "loss": 1}\n')   # line 3: complete but not a record
        f.write("\n")
        for r in recs[2:]:
            f.write(line(r))
        f.write(line(train_record(5))[:40])      # torn: the trainer was writing it
    err = ctx.report(run, "--tensorboard", tb)
    check("metrics.jsonl:3: skipped, not a metrics record" in err, "the malformed line 3 is not reported")
    check("metrics.jsonl:9: incomplete last line" in err, "the torn last line 9 is not reported")
    check("wrote 6 record(s)" in err, "not 6 records written")
    scalars, hists = read_tb(tb)
    check_tb_scalars(scalars, recs, "replay")
    check(set(hists) == {HIST_TAG} and [s for s, _ in hists[HIST_TAG]] == [4], f"histograms: {hists}")
    check_tb_histogram(hists[HIST_TAG][0][1], 4, spec_record(4)["spec_kept_histogram"], "replay")
    events = sorted(glob.glob(os.path.join(tb, "events.out.tfevents.*")))
    check(len(events) == 1, f"event files {events}")

    # the same replay again: nothing written, no new event file
    err = ctx.report(run, "--tensorboard", tb)
    check("wrote 0 record(s), skipped 6" in err, "a second replay wrote again")
    check(sorted(glob.glob(os.path.join(tb, "events.out.tfevents.*"))) == events, "a replay that wrote nothing "
          "made an event file")

    # the torn line completed, more steps and an eval: only those are written (a second event file)
    more = [train_record(5), train_record(6), eval_record(6), spec_record(6, hist=(0, 1, 0, 0, 0, 0, 0, 0, 9))]
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write(line(more[0])[40:])
        for r in more[1:]:
            f.write(line(r))
    err = ctx.report(run, "--tensorboard", tb)
    check("wrote 4 record(s), skipped 6" in err, "the grown file: not 4 new records")
    scalars, hists = read_tb(tb)
    check_tb_scalars(scalars, recs + more, "after growth")
    check([s for s, _ in hists[HIST_TAG]] == [4, 6], f"histogram steps {[s for s, _ in hists[HIST_TAG]]}")
    check_tb_histogram(hists[HIST_TAG][1][1], 6, more[3]["spec_kept_histogram"], "after growth")
    check(len(glob.glob(os.path.join(tb, "events.out.tfevents.*"))) == 2, "not one more event file")
    state = json.load(open(os.path.join(tb, "dflash_report_state.json")))
    check(state["last_step"] == {"train": 6, "eval": 6, "spec_eval": 6}, f"state {state}")

    # an attempt that found no checkpoint (ckpt.resume auto at step 0): the trainer drops every record and re-runs
    # step 1 with other timings; no superseded/ folder: the same series, nothing written twice
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write(line(dict(train_record(1), tokens_per_s=1.0)))
    err = ctx.report(run, "--tensorboard", tb)
    check("is not the one it was written from" in err and "wrote 0 record(s), skipped 1" in err,
          "a re-run step 1 is not recognised as the same series")

    # run.start_over: the trainer moved metrics.jsonl to RUN_DIR/superseded/<time>/ and starts at step 1 again:
    # a new series; the earlier event files move to TB/superseded/<time>/ (a run of its own in TensorBoard)
    aside = os.path.join(run, "superseded", "20260101T000000Z")
    os.makedirs(aside)
    os.replace(os.path.join(run, "metrics.jsonl"), os.path.join(aside, "metrics.jsonl"))
    fresh = [train_record(1, shift=2.0), train_record(2, shift=2.0)]
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        for r in fresh:
            f.write(line(r))
    err = ctx.report(run, "--tensorboard", tb)
    check("was started over" in err and "wrote 2 record(s), skipped 0" in err, "run.start_over: not a new series")
    check(glob.glob(os.path.join(tb, "events.out.tfevents.*")) and
          len(glob.glob(os.path.join(tb, "superseded", "*", "events.out.tfevents.*"))) == 2,
          "the earlier run's 2 event files are not under superseded/")
    scalars, _ = read_tb(tb)
    check_tb_scalars(scalars, fresh, "after run.start_over")
    old_scalars, _ = read_tb(glob.glob(os.path.join(tb, "superseded", "*"))[0])
    check_tb_scalars(old_scalars, recs + more, "the superseded run")

    # usage errors
    ctx.report(run, expect_rc=2)
    ctx.report(os.path.join(ctx.work, "nowhere"), "--tensorboard", tb, expect_rc=1)
    return "6 + 4 records, 40 tags, histogram counts, idempotent replays, a re-run step 1, run.start_over"


# ------------------------------------------------------------------------------------- W&B offline read-back

def wandb_records(path):
    """The records of a .wandb transaction log (LevelDB log format: 32 KiB blocks of [crc32c u32, length u16,
    type u8] chunks; type 1 full, 2 first, 3 middle, 4 last), after its 7-byte ':W&B' header."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(path, "rb").read()
    check(data[:4] == b":W&B", f"{path}: not a W&B transaction log")
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, typ = struct.unpack("<IHB", data[pos:pos + 7])
        if typ == 0 and n == 0:
            pos += left
            continue
        payload, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if typ in (1, 2):
            pending = payload
        else:
            pending += payload
        if typ in (1, 4):
            r = pb.Record()
            r.ParseFromString(pending)
            yield r


def wandb_history(path):
    """(run id, [{key: value}] per history row, with '_step'); nested keys joined with '/' down to the histogram's
    parts (tag/_type, tag/values, tag/bins)."""
    run_id, rows = None, []
    for r in wandb_records(path):
        which = r.WhichOneof("record_type")
        if which == "run":
            run_id = r.run.run_id
        elif which == "history":
            row = {}
            for item in r.history.item:
                key = "/".join(item.nested_key) if item.nested_key else item.key
                row[key] = json.loads(item.value_json)
            row["_step"] = r.history.step.num
            rows.append(row)
    return run_id, rows


def case_wandb(ctx):
    run, wdir = os.path.join(ctx.work, "run"), os.path.join(ctx.work, "wandb_dir")
    os.makedirs(run)
    first = [train_record(1), train_record(2), eval_record(2), spec_record(2), train_record(3)]
    first[1]["kl"] = None
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        for r in first:
            f.write(line(r))
        f.write("garbage\n")   # line 6
    env = dict(ctx.env, WANDB_MODE="offline", WANDB_DIR=wdir)
    err = ctx.report(run, "--wandb", "dflash-test", "--offline", "--wandb-dir", wdir, env=env)
    check("metrics.jsonl:6: skipped" in err, "the malformed line 6 is not reported")
    err = ctx.report(run, "--wandb", "dflash-test", "--offline", "--wandb-dir", wdir, env=env)
    check("wrote 0 record(s), skipped 5" in err, "a second replay logged again")
    second = [train_record(4), eval_record(4), spec_record(4, hist=(0, 2, 0, 5, 0, 0, 0, 0, 0))]
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        for r in second:
            f.write(line(r))
    ctx.report(run, "--wandb", "dflash-test", "--offline", "--wandb-dir", wdir, env=env)

    logs = sorted(glob.glob(os.path.join(wdir, "wandb", "offline-run-*", "run-*.wandb")))
    check(len(logs) == 2, f"offline runs {logs}: expected 2 (the replay that logged nothing starts none)")
    state_path = os.path.join(run, "report_state", "wandb-dflash-test-offline.json")
    first_id = json.load(open(state_path))["run_id"]
    ids, rows = set(), []
    for path in logs:
        run_id, r = wandb_history(path)
        ids.add(run_id)
        rows += r
    check(ids == {first_id}, f"run ids {ids}, state {first_id}")
    steps = [r["_step"] for r in rows]
    check(steps == [1, 2, 3, 4], f"history steps {steps}: each step once, in order")
    want = {}
    for rec in first + second:
        want.setdefault(rec["step"], {}).update(expected_values(rec))
    for row in rows:
        s = row["_step"]
        got = {k: v for k, v in row.items() if not k.startswith("_") and not k.startswith(HIST_TAG)}
        check(set(got) == set(want[s]), f"step {s}: keys differ: extra {sorted(set(got) - set(want[s]))}, "
              f"missing {sorted(set(want[s]) - set(got))}")
        for k, v in want[s].items():
            check(same(float(got[k]), v), f"step {s}: {k} = {got[k]!r}, expected {v!r}")
    for s, rec in ((2, first[3]), (4, second[2])):
        row = rows[steps.index(s)]
        counts = rec["spec_kept_histogram"]
        check(row[HIST_TAG + "/_type"] == "histogram", f"step {s}: {HIST_TAG} is not a histogram")
        check(row[HIST_TAG + "/values"] == counts, f"step {s}: histogram values {row[HIST_TAG + '/values']}")
        check(row[HIST_TAG + "/bins"] == [k - 0.5 for k in range(len(counts) + 1)], f"step {s}: bins "
              f"{row[HIST_TAG + '/bins']}")

    # run.start_over (the earlier metrics.jsonl moved to RUN_DIR/superseded/<time>/): a new W&B run
    aside = os.path.join(run, "superseded", "20260101T000000Z")
    os.makedirs(aside)
    os.replace(os.path.join(run, "metrics.jsonl"), os.path.join(aside, "metrics.jsonl"))
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write(line(train_record(1, shift=3.0)))
    err = ctx.report(run, "--wandb", "dflash-test", "--offline", "--wandb-dir", wdir, env=env)
    new_id = json.load(open(state_path))["run_id"]
    check("was started over" in err and new_id != first_id, f"run.start_over: run id {new_id}, before {first_id}")
    new_logs = glob.glob(os.path.join(wdir, "wandb", f"offline-run-*-{new_id}", f"run-{new_id}.wandb"))
    check(len(new_logs) == 1, f"no offline run {new_id}")
    _, new_rows = wandb_history(new_logs[0])
    check([r["_step"] for r in new_rows] == [1] and new_rows[0]["train/loss"] == train_record(1, shift=3.0)["loss"],
          f"the new run's history {new_rows}")
    return f"4 steps, one run id {first_id}, exact values, histograms; run.start_over: new run {new_id}"


# ------------------------------------------------------------------------------------------------ follow mode

def wait_for(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise Fail(f"timed out after {timeout} s waiting for {what}")


def tb_state(tb):
    try:
        return json.load(open(os.path.join(tb, "dflash_report_state.json")))["last_step"]
    except (OSError, ValueError, KeyError):
        return {}


def append(path, text):
    with open(path, "a") as f:
        f.write(text)
        f.flush()


def case_follow(ctx):
    run, tb = os.path.join(ctx.work, "run"), os.path.join(ctx.work, "tb")
    os.makedirs(run)
    metrics, lock = os.path.join(run, "metrics.jsonl"), os.path.join(run, "LOCK")
    log = os.path.join(ctx.work, "follower.log")
    # started before the job: no metrics.jsonl, no LOCK yet
    p = ctx.popen(run, "--tensorboard", tb, "--follow", "--poll", "0.2", "--start-timeout", "60", log=log)
    try:
        time.sleep(0.5)
        with open(lock, "w") as f:   # what RunLock writes (lib/job/run_lock.cpp)
            f.write(f"host: {socket.gethostname()}\npid: {os.getpid()}\njob: \nrestarts: 0\nsince: now\n")
        for s in (1, 2, 3):
            append(metrics, line(train_record(s)))
            time.sleep(0.1)
        half = line(train_record(4))
        append(metrics, half[:25])
        wait_for(lambda: tb_state(tb).get("train") == 3, 10, "steps 1-3 live")
        time.sleep(0.6)   # the follower polls the half line a few times
        check(p.poll() is None, "the follower ended while the job runs")
        check(tb_state(tb).get("train") == 3, "a half line was taken")
        append(metrics, half[25:])
        wait_for(lambda: tb_state(tb).get("train") == 4, 10, "step 4 once its line is complete")
        # a resumed attempt (checkpoint at step 2): the file is rewritten atomically with steps <= 2, then steps
        # 3 and 4 again (other values: not written twice) and new ones
        kept = "".join(line(train_record(s)) for s in (1, 2))
        with open(metrics + ".tmp", "w") as f:
            f.write(kept)
        os.replace(metrics + ".tmp", metrics)
        for r in (train_record(3, shift=1.0), train_record(4, shift=1.0), train_record(5), train_record(6),
                  eval_record(6), spec_record(6)):
            append(metrics, line(r))
        append(metrics, "{torn and then something else\n")   # line 9 of the rewritten file
        append(metrics, line(train_record(7)))
        wait_for(lambda: tb_state(tb).get("train") == 7, 10, "the records after the rewrite")
        time.sleep(0.3)
        check(p.poll() is None, "the follower ended while the job holds LOCK")
        os.remove(lock)   # RunLock::release at the job's end
        t0 = time.monotonic()
        rc = p.wait(timeout=10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    err = open(log).read()
    sys.stderr.write(err)
    check(rc == 0, f"follower exit {rc}")
    check(took < 5, f"the follower took {took:.1f} s to end after LOCK was released")
    check("LOCK released: the job ended" in err, "no end reason")
    check("was rewritten" in err, "the rewrite is not reported")
    check("metrics.jsonl:9: skipped" in err, "the malformed line 9 is not reported")
    scalars, hists = read_tb(tb)
    recs = [train_record(s) for s in (1, 2, 3, 4, 5, 6)] + [eval_record(6), spec_record(6), train_record(7)]
    check_tb_scalars(scalars, recs, "follow")
    check([s for s, _ in hists[HIST_TAG]] == [6], "histogram steps")
    check_tb_histogram(hists[HIST_TAG][0][1], 6, spec_record(6)["spec_kept_histogram"], "follow")
    # a replay after the live follow adds nothing
    err = ctx.report(run, "--tensorboard", tb)
    check("wrote 0 record(s)" in err, "a replay after the follow wrote again")
    return f"live steps 1-7 with a half line and a rewrite, ended {took:.1f} s after LOCK was released"


WRITER = r"""
import json, sys, time
path, done = sys.argv[1], sys.argv[2]
recs = [json.loads(l) for l in sys.argv[3:]]
for i, r in enumerate(recs):
    t = json.dumps(r, separators=(",", ":")) + "\n"
    with open(path, "a") as f:
        f.write(t[:30]); f.flush(); time.sleep(0.25); f.write(t[30:])
    time.sleep(0.1)
open(done, "w").close()
"""


def case_follow_pid(ctx):
    run, tb = os.path.join(ctx.work, "run"), os.path.join(ctx.work, "tb")
    os.makedirs(run)
    metrics, done = os.path.join(run, "metrics.jsonl"), os.path.join(ctx.work, "writer_done")
    recs = [train_record(s) for s in (1, 2, 3, 4)] + [eval_record(4), spec_record(4)]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, metrics, done] + [json.dumps(r) for r in recs])
    log = os.path.join(ctx.work, "follower.log")
    p = ctx.popen(run, "--tensorboard", tb, "--follow", "--pid", str(writer.pid), "--poll", "0.2", log=log)
    try:
        wait_for(lambda: tb_state(tb).get("train", 0) >= 1, 10, "the first record")
        p.send_signal(signal.SIGUSR1)   # the job's stop signal: not the follower's
        wait_for(lambda: os.path.exists(done), 20, "the writer")
        t0 = time.monotonic()
        # the writer is not reaped until the follower has ended: it is a zombie meanwhile, which counts as exited
        rc = p.wait(timeout=10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
        writer.wait()
    err = open(log).read()
    sys.stderr.write(err)
    check(rc == 0, f"follower exit {rc} (SIGUSR1 must be ignored)")
    check(took < 5, f"the follower took {took:.1f} s to end after process {writer.pid} exited")
    check(f"process {writer.pid} exited" in err, "no end reason")
    scalars, hists = read_tb(tb)
    check_tb_scalars(scalars, recs, "follow --pid")
    check_tb_histogram(hists[HIST_TAG][0][1], 4, spec_record(4)["spec_kept_histogram"], "follow --pid")

    # SIGTERM: what is written is drained, exit 0
    run2, tb2 = os.path.join(ctx.work, "run2"), os.path.join(ctx.work, "tb2")
    os.makedirs(run2)
    with open(os.path.join(run2, "metrics.jsonl"), "w") as f:
        f.write(line(train_record(1)))
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        p = ctx.popen(run2, "--tensorboard", tb2, "--follow", "--pid", str(sleeper.pid), "--poll", "0.2",
                      log=log + "2")
        wait_for(lambda: tb_state(tb2).get("train") == 1, 10, "step 1")
        append(os.path.join(run2, "metrics.jsonl"), line(train_record(2)))
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=10)
    finally:
        sleeper.kill()
        sleeper.wait()
    err = open(log + "2").read()
    sys.stderr.write(err)
    check(rc == 0 and "stopped by SIGTERM" in err, f"SIGTERM: exit {rc}")
    check(tb_state(tb2).get("train") == 2, "SIGTERM: step 2 not drained")

    # no --pid and no job ever: --start-timeout ends it
    t0 = time.monotonic()
    err = ctx.report(run2, "--tensorboard", tb2, "--follow", "--poll", "0.1", "--start-timeout", "1")
    check("no job held" in err and time.monotonic() - t0 < 10, "--start-timeout did not end the follow")
    return f"ended {took:.1f} s after its --pid exited (a zombie); SIGUSR1 ignored; SIGTERM drains; start timeout"


# ------------------------------------------------------------------------------------------- launch scripts

STUB_DFLASH = r"""#!/usr/bin/env bash
# stub dflash_mpi: --print-key KEY from $STUB_KEYS (lines KEY=VALUE; a key not there: unknown, exit 1, as an older
# binary); otherwise the job: records its pid, appends $STUB_LINES to metrics.jsonl, exits $STUB_RC
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  if [[ "${args[i]}" == --print-key ]]; then
    k="${args[i+1]}"
    grep -q "^$k=" "$STUB_KEYS" || { echo "dflash_mpi --print-key: error: unknown config key '$k'" >&2; exit 1; }
    sed -n "s|^$k=||p" "$STUB_KEYS"
    exit 0
  fi
done
out=$(sed -n 's|^run.out_dir=||p' "$STUB_KEYS")
mkdir -p "$out"
echo $$ >"$out/job.pid"
stop=0
trap 'echo USR1 >>"$out/signals"; stop=1' USR1
if [[ "${STUB_WAIT_FOLLOWER:-0}" == 1 ]]; then   # a job that outlives the follower's start
  for ((i = 0; i < 200; ++i)); do grep -qs following "$out/logs/report.log" && break; sleep 0.1; done
fi
while IFS= read -r l; do
  printf '%s\n' "$l" >>"$out/metrics.jsonl"
  sleep 0.15
done <"$STUB_LINES"
if [[ "${STUB_WAIT_USR1:-0}" == 1 ]]; then
  for ((i = 0; i < 200 && stop == 0; ++i)); do sleep 0.1; done
fi
# what world rank 0 writes when every rank is done (the sbatch scripts' requeue decision reads it)
printf '{\n  "outcome": "partial",\n  "step": 0\n}\n' >"$out/status.json"
exit "${STUB_RC:-0}"
"""
STUB_MPIRUN = r"""#!/usr/bin/env bash
while [[ $# -gt 0 ]]; do case "$1" in -np|-x|--bind-to|--map-by) shift 2 ;; -*) shift ;; *) break ;; esac; done
exec "$@"
"""
STUB_SRUN = r"""#!/usr/bin/env bash
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
exec "$@"
"""


class Stubs:
    def __init__(self, ctx, name):
        self.dir = os.path.join(ctx.work, name)
        self.bin = os.path.join(self.dir, "bin")
        os.makedirs(self.bin)
        for n, text in (("dflash_mpi", STUB_DFLASH), ("mpirun", STUB_MPIRUN), ("srun", STUB_SRUN),
                        ("scontrol", f'#!/usr/bin/env bash\necho "$*" >>"{self.dir}/scontrol.log"\n')):
            with open(os.path.join(self.bin, n), "w") as f:
                f.write(text)
            os.chmod(os.path.join(self.bin, n), 0o755)
        self.out = os.path.join(self.dir, "run")
        self.tb = os.path.join(self.dir, "tb")
        self.keys = os.path.join(self.dir, "keys")
        self.lines = os.path.join(self.dir, "lines.jsonl")
        self.recs = [train_record(s) for s in (1, 2, 3)] + [eval_record(3), spec_record(3), train_record(4)]
        with open(self.lines, "w") as f:
            for r in self.recs:
                f.write(line(r))
        self.env = dict(ctx.env, PATH=f"{self.bin}:{os.environ['PATH']}", STUB_KEYS=self.keys, STUB_LINES=self.lines,
                        DFLASH_BIN=os.path.join(self.bin, "dflash_mpi"), DFLASH_REPORT_PYTHON=ctx.py,
                        WANDB_MODE="offline")
        self.env.pop("WANDB_DIR", None)

    def set_keys(self, **keys):
        with open(self.keys, "w") as f:
            for k, v in keys.items():
                f.write(f"{k.replace('__', '.')}={v}\n")


def follower_summary(out):
    try:
        return "records read" in open(os.path.join(out, "logs", "report.log")).read()
    except OSError:
        return False


def case_launcher(ctx):
    script = os.path.join(ctx.src, "mpi_launch", "run_local.sh")
    cfg = os.path.join(ctx.work, "cfg.yaml")
    open(cfg, "w").close()
    st = Stubs(ctx, "with_follower")
    st.set_keys(run__out_dir=st.out, report__tensorboard=st.tb, report__wandb="dflash-launch",
                report__wandb_offline="true")
    p = subprocess.Popen(["bash", script, "-np", "2", cfg], env=dict(st.env, STUB_RC="3", STUB_WAIT_FOLLOWER="1"),
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    sys.stderr.write(out + err)
    check(p.returncode == 3, f"run_local.sh exit {p.returncode}: the job's exit status 3 must come through")
    check(int(open(os.path.join(st.out, "job.pid")).read()) == p.pid, "the job does not run under the script's "
          "pid: mpirun is no longer exec'd (signals to the script would miss it)")
    check("metrics follower (pid" in out, "the follower was not announced")
    t0 = time.monotonic()
    wait_for(lambda: follower_summary(st.out), 15, "the follower to end by itself after mpirun")
    took = time.monotonic() - t0
    log = open(os.path.join(st.out, "logs", "report.log")).read()
    check("exited" in log, f"the follower did not end on its --pid: {log}")
    scalars, hists = read_tb(st.tb)
    check_tb_scalars(scalars, st.recs, "run_local.sh")
    check(len(glob.glob(os.path.join(st.out, "wandb", "offline-run-*", "run-*.wandb"))) == 1, "no offline W&B run "
          "(report.wandb_offline true)")

    # no Python environment for it: a warning naming the install, the job as before
    st2 = Stubs(ctx, "no_python")
    st2.set_keys(run__out_dir=st2.out, report__tensorboard=st2.tb, report__wandb="", report__wandb_offline="false")
    r = subprocess.run(["bash", script, "-np", "2", cfg], env=dict(st2.env, STUB_RC="0",
                       DFLASH_REPORT_PYTHON="/nonexistent/python"), capture_output=True, text=True, timeout=60)
    sys.stderr.write(r.stdout + r.stderr)
    check(r.returncode == 0, f"no Python environment: exit {r.returncode}")
    check("warning:" in r.stderr and "install_prep.sh --report" in r.stderr, "no warning naming the install")
    check(not os.path.exists(st2.tb), "a follower ran without a Python environment")
    check(len(open(os.path.join(st2.out, "metrics.jsonl")).readlines()) == len(st2.recs), "the job did not run")

    # a binary without the report.* keys (or none set): no follower, no warning, exit status as before
    st3 = Stubs(ctx, "old_binary")
    st3.set_keys(run__out_dir=st3.out)
    r = subprocess.run(["bash", script, "-np", "2", cfg], env=dict(st3.env, STUB_RC="5"), capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 5 and "follower" not in r.stdout + r.stderr and "warning" not in r.stderr,
          f"no report keys: exit {r.returncode}, output {r.stdout + r.stderr!r}")
    check(not os.path.exists(os.path.join(st3.out, "logs", "report.log")), "a follower ran without report keys")
    return f"exit status and pid kept; the follower ended {took:.1f} s after mpirun; warning without Python"


def case_sbatch(ctx):
    cfg = os.path.join(ctx.work, "cfg.yaml")
    open(cfg, "w").close()
    results = []
    for script, launcher in (("single_node.sbatch", "srun"), ("single_node.sbatch", "mpirun"),
                             ("multi_node.sbatch", "srun")):
        st = Stubs(ctx, f"{script}_{launcher}")
        st.set_keys(run__out_dir=st.out, report__tensorboard=st.tb, report__wandb="", report__wandb_offline="false")
        env = dict(st.env, SLURM_JOB_ID="42", SLURM_NTASKS="8", SLURM_CPUS_PER_TASK="1", DFLASH_ROOT=ctx.src,
                   DFLASH_LAUNCHER=launcher, STUB_WAIT_FOLLOWER="1")
        if launcher == "mpirun":
            env["STUB_WAIT_USR1"] = "1"   # the job runs until SIGUSR1 reaches it
        p = subprocess.Popen(["bash", os.path.join(ctx.src, "mpi_launch", "slurm", script), cfg], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if launcher == "mpirun":
            metrics = os.path.join(st.out, "metrics.jsonl")
            wait_for(lambda: os.path.exists(metrics) and len(open(metrics).readlines()) == len(st.recs), 30,
                     "the stub job's records")
            time.sleep(0.3)
            p.send_signal(signal.SIGUSR1)   # --signal=B:USR1@600: slurm signals the batch script
        out, err = p.communicate(timeout=60)
        sys.stderr.write(out + err)
        what = f"{script} ({launcher})"
        check(p.returncode == 0, f"{what}: exit {p.returncode}")
        check("dflash: attempt ended with exit 0: partial" in out, f"{what}: outcome line missing")
        check("metrics follower (pid" in out, f"{what}: the follower was not started")
        # waited for: its summary is there the moment the script has returned
        check(follower_summary(st.out), f"{what}: the script returned before its follower had ended")
        if launcher == "mpirun":
            check(open(os.path.join(st.out, "signals")).read().split() == ["USR1"], f"{what}: SIGUSR1 not "
                  "forwarded to mpirun")
        check(not os.path.exists(os.path.join(st.dir, "scontrol.log")), f"{what}: requeued")
        scalars, _ = read_tb(st.tb)
        check_tb_scalars(scalars, st.recs, what)
        results.append(what)
    return "follower stopped and waited for: " + ", ".join(results) + "; SIGUSR1 forwarded"


def case_trainer(ctx):
    binary = os.path.join(ctx.build, "apps", "dflash_mpi")
    tiny = os.path.join(ctx.build, "tests", "integration", "tiny_data")
    cfg = os.path.join(ctx.src, "mpi_launch", "configs", "tiny.yaml")
    probe = subprocess.run([binary, cfg, "--print-key", "report.tensorboard"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"SKIP (trainer): {binary} has no report.* keys ({probe.stderr.strip()[:120]})")
        sys.exit(77)
    out, tb = os.path.join(ctx.work, "run"), os.path.join(ctx.work, "tb")
    sets = [f"target.path={tiny}/target", f"data.path={tiny}/train.h5", f"run.out_dir={out}", "run.steps=3",
            "log.every=1", f"report.tensorboard={tb}"]
    env = dict(ctx.env, DFLASH_BIN=binary, DFLASH_REPORT_PYTHON=ctx.py, OMP_NUM_THREADS="1")
    cmd = ["bash", os.path.join(ctx.src, "mpi_launch", "run_local.sh"), "-np", "8", cfg]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
    check(r.returncode == 0, f"the tiny job: exit {r.returncode}")
    wait_for(lambda: follower_summary(out), 30, "the follower to end after the job")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    check([r["step"] for r in recs] == [1, 2, 3], f"metrics steps {[r['step'] for r in recs]}")
    scalars, _ = read_tb(tb)
    check_tb_scalars(scalars, recs, "the tiny job")
    return f"{len(recs)} records of the real trainer, {len(scalars)} tags"


CASES = {"tensorboard": case_tensorboard, "wandb": case_wandb, "follow": case_follow, "follow_pid": case_follow_pid,
         "launcher": case_launcher, "sbatch": case_sbatch, "trainer": case_trainer}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--src", required=True)
    p.add_argument("--build", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    t0 = time.monotonic()
    try:
        what = CASES[args.case](Ctx(args))
    except Fail as e:
        print(f"FAIL ({args.case}): {e}")
        return 1
    print(f"PASS ({args.case}): {what} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
