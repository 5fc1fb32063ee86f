"""What the docs say runs, runs: every command a user is told to run, exactly as written, in a stand-in checkout.

Where the commands come from (mechanically, so that a doc edit cannot drift from this test):
  - every ```bash block of README.md and docs/*.md (README first, then docs/ by name), indented ones in list items
    too; a block right after a line <!-- docs-test: not run: REASON --> is listed as not run, with the reason;
  - the header of every mpi_launch/configs/*.yaml: a comment line '#   command' (three spaces), continued on
    '#     ...' lines after a trailing backslash. A template's run line (mpi_launch/run_local.sh) whose target folder
    holds no weights is not run (its --check line is); such a --check must end INCOMPLETE (exit 2) or DOES NOT FIT
    (exit 3) after printing the plan.
Every other command must exit 0. A block runs as one bash script (set -e); a command line run before (the same
text) is not run again. Commands run from the root of the stand-in checkout: the source tree's folders linked in,
build/ = this build, fresh runs/ and data/ (data/'s files linked), and what a user brings: models/Qwen3-8B (a random
Qwen3, 8 layers × H 64 with Qwen3-8B's vocabulary and a small BPE tokenizer with Qwen3's special tokens),
chats.jsonl, sets.jsonl, my.yaml (mpi_launch/configs/qwen3_8b.yaml pointed at those, a few steps, run.out_dir runs/x)
and YOUR.h5 (the tiny data). The sbatch lines are run by tests/integration/slurm/slurm_real.sh on a real slurm.
Exit 77 (skipped) only when data/prep's Python environment cannot be made (install_prep.sh failed).
  docs_commands.py SOURCE_DIR BUILD_DIR WORK_DIR"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

NOT_RUN = re.compile(r"<!--\s*docs-test:\s*not run:\s*(.*?)\s*-->")
FENCE_OPEN = re.compile(r"^(\s*)```bash\s*$")
FENCE_CLOSE = re.compile(r"^\s*```\s*$")


def strip_comment(line):
    """The line without a trailing shell comment (a '#' at the start or after a blank, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


class Block:
    def __init__(self, where, lines, not_run=None, template=None):
        self.where, self.lines, self.not_run, self.template = where, lines, not_run, template

    def logical_lines(self):
        """The commands: lines joined at a trailing backslash; comments and blank lines dropped."""
        out, cur = [], ""
        for line in self.lines:
            if cur:
                cur += " " + line.strip()
            else:
                cur = line.strip()
            if cur.endswith("\\"):
                cur = cur[:-1].rstrip()
                continue
            cur = strip_comment(cur)
            if cur:
                out.append(re.sub(r"\s+", " ", cur))
            cur = ""
        if cur:
            out.append(cur)
        return out


def markdown_blocks(path, rel):
    lines = open(path).read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = len(m.group(1)), i
        body = []
        i += 1
        while i < len(lines) and not FENCE_CLOSE.match(lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        prev = lines[start - 1] if start > 0 else ""
        marker = NOT_RUN.search(prev)
        blocks.append(Block(f"{rel}:{start + 1}", body, marker.group(1) if marker else None))
        i += 1
    return blocks


def template_blocks(path, rel):
    blocks, cur, cur_line = [], None, 0
    for n, line in enumerate(open(path).read().split("\n"), 1):
        if not line.startswith("#"):
            break  # the header ends at the first key
        if cur is not None and cur[-1].rstrip().endswith("\\") and line.startswith("#     "):
            cur.append(line[1:])
            continue
        if cur is not None:
            blocks.append(Block(f"{rel}:{cur_line}", cur, template=rel))
            cur = None
        if re.match(r"^#   \S", line):
            cur, cur_line = [line[1:]], n
    if cur is not None:
        blocks.append(Block(f"{rel}:{cur_line}", cur, template=rel))
    return blocks


def all_blocks(src):
    blocks = markdown_blocks(os.path.join(src, "README.md"), "README.md")
    for name in sorted(os.listdir(os.path.join(src, "docs"))):
        if name.endswith(".md"):
            blocks += markdown_blocks(os.path.join(src, "docs", name), "docs/" + name)
    cfg = os.path.join(src, "mpi_launch", "configs")
    for name in sorted(os.listdir(cfg)):
        if name.endswith(".yaml"):
            blocks += template_blocks(os.path.join(cfg, name), "mpi_launch/configs/" + name)
    return blocks


def run(cmd, cwd, env, timeout=600, check=True):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        sys.stdout.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit(f"FAIL: setup step {cmd[:3]}... exited {r.returncode}")
    return r


CHATS = [
    ("Hello, how are you today?", "I am fine, thank you very much."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is two plus two?", "<think>\nAdd them.\n</think>\n\nTwo plus two is four."),
    ("Tell me a story about a cat.", "A cat and a dog live in a small house near the river bank."),
    ("Write a short poem about the sea.", "The sea, the wind and the stars sing at night."),
    ("Is the quick brown fox fast?", "Yes: the quick brown fox jumps over the lazy dog."),
]


def make_checkout(src, build, work, env):
    """The stand-in checkout a user would have after cloning and bringing their model, chats and config."""
    co = os.path.join(work, "checkout")
    shutil.rmtree(co, ignore_errors=True)
    os.makedirs(co)
    for name in os.listdir(src):
        if name in (".git", "runs", "data", "models", "out") or name.startswith("build"):
            continue
        os.symlink(os.path.join(src, name), os.path.join(co, name))
    os.symlink(build, os.path.join(co, "build"))
    os.makedirs(os.path.join(co, "data"))
    for name in os.listdir(os.path.join(src, "data")):
        os.symlink(os.path.join(src, "data", name), os.path.join(co, "data", name))
    os.makedirs(os.path.join(co, "runs"))

    # models/Qwen3-8B: a random Qwen3 with Qwen3-8B's vocabulary (the mask token 151669 fits), TP 5 splits its 8
    # KV heads as the 8B's; the tokenizer of the data_prep tests (Qwen3's special tokens, ChatML template)
    model = os.path.join(co, "models", "Qwen3-8B")
    run([os.path.join(build, "apps", "dflash_data"), "make-target", "--out", model, "--hidden", "64", "--layers", "8",
         "--heads", "16", "--kv-heads", "8", "--head-dim", "16", "--intermediate", "128", "--vocab", "151936",
         "--seed", "3"], co, env)
    py = os.path.join(src, "data", "prep", ".venv", "bin", "python")
    run([py, os.path.join(src, "tests", "integration", "data_prep", "make_tokenizer.py"), model], co, env)
    cfg_path = os.path.join(model, "config.json")
    cfg = json.load(open(cfg_path))
    cfg.update(bos_token_id=0, eos_token_id=2)  # <|endoftext|>, <|im_end|>: special tokens of that tokenizer
    json.dump(cfg, open(cfg_path, "w"), indent=2)

    with open(os.path.join(co, "chats.jsonl"), "w") as f:
        for i in range(24):
            q, a = CHATS[i % len(CHATS)]
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}) + "\n")
    with open(os.path.join(co, "sets.jsonl"), "w") as f:  # a GSM8K-style and an MT-Bench-style prompt
        f.write(json.dumps({"question": CHATS[2][0]}) + "\n")
        f.write(json.dumps({"turns": ["Tell me a story about a dog.", "Make it shorter."]}) + "\n")
    shutil.copy(os.path.join(build, "tests", "integration", "tiny_data", "train.h5"), os.path.join(co, "YOUR.h5"))

    # my.yaml: the 8B template with the user's paths (relative to my.yaml's folder, the checkout root) and a short run
    text = open(os.path.join(src, "mpi_launch", "configs", "qwen3_8b.yaml")).read()
    # (run.device cpu: the template is a GPU run, the stand-in machine has none)
    edits = {("run", "out_dir"): "runs/x", ("run", "steps"): "8", ("run", "device"): "cpu",
             ("target", "path"): "models/Qwen3-8B",
             ("drafter", "layers"): "1", ("drafter", "block_size"): "8", ("loss", "anchors_per_seq"): "8",
             ("optim", "micro_batches"): "1", ("data", "path"): "data/train.h5", ("ckpt", "every"): "4",
             ("log", "every"): "1"}
    out, section, done = [], None, set()
    for line in text.split("\n"):
        m = re.match(r"^(\w+):\s*$", line)
        if m:
            section = m.group(1)
        m = re.match(r"^  (\w+):(\s*)(\S.*?)(\s+#.*)?$", line)
        if m and (section, m.group(1)) in edits:
            line = f"  {m.group(1)}: {edits[(section, m.group(1))]}"
            done.add((section, m.group(1)))
        out.append(line)
    missing = set(edits) - done
    if missing:
        raise SystemExit(f"FAIL: mpi_launch/configs/qwen3_8b.yaml has no {sorted(missing)}: update my.yaml's edits")
    open(os.path.join(co, "my.yaml"), "w").write("\n".join(out))
    return co


def template_target_has_weights(build, co, template, env):
    r = run([os.path.join(build, "apps", "dflash_mpi"), template, "--print-key", "target.path"], co, env, check=False)
    d = r.stdout.strip()
    return r.returncode == 0 and os.path.isdir(d) and any(n.endswith(".safetensors") for n in os.listdir(d))


def main():
    src, build, work = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r = run(["bash", os.path.join(src, "mpi_launch", "install_prep.sh")], src, env, check=False)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        print("skipped: data/prep's Python environment cannot be made (mpi_launch/install_prep.sh failed above)")
        sys.exit(77)
    t0 = time.monotonic()
    co = make_checkout(src, build, work, env)
    print(f"stand-in checkout {co} ready in {time.monotonic() - t0:.0f} s")

    blocks = all_blocks(src)
    ran, failed, not_run, seen = [], [], [], set()
    for i, b in enumerate(blocks):
        cmds = b.logical_lines()
        if b.not_run:
            not_run.append(f"{b.where}: {cmds[0] if cmds else ''} ... -- {b.not_run}")
            continue
        expect = (0,)
        if b.template:
            tmpl = b.template
            if not template_target_has_weights(build, co, tmpl, env):
                if any("run_local.sh" in c for c in cmds):
                    not_run.append(f"{b.where}: {cmds[0]} -- the target's weights are not here "
                                   "(its folder holds config.json only); its --check line is run")
                    continue
                if any("--check" in c for c in cmds):
                    expect = (2, 3)
        todo = [c for c in cmds if c not in seen]
        if not todo:
            continue
        script = "\n".join(l for l in b.lines if l.strip())  # as written, continuations and comments included
        if len(todo) < len(cmds):  # a command run by an earlier block is not run again
            script = "\n".join(todo)
        t = time.monotonic()
        log = os.path.join(work, f"block_{i:02d}.log")
        with open(log, "w") as f:
            p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=co, env=env, stdout=f,
                               stderr=subprocess.STDOUT, timeout=900)
        took = time.monotonic() - t
        text = open(log).read()
        ok = p.returncode in expect
        if ok and expect != (0,):
            ok = re.search(r"check: (INCOMPLETE|DOES NOT FIT)", text) and re.search(r"^\s+ranks\s", text, re.M) \
                and re.search(r"^\s+drafter\s", text, re.M)
        what = f"{b.where} ({took:.0f} s, exit {p.returncode}): " + " && ".join(todo)
        seen.update(todo)
        if ok:
            ran.append(what)
            print(f"ran {what}")
        else:
            failed.append(what)
            print(f"FAIL {what}\n---- {log} (last lines)\n{text[-3000:]}----")
    print(f"---- {len(ran)} blocks ran as written, {len(failed)} failed, {len(not_run)} not run:")
    for n in not_run:
        print(f"  not run: {n}")
    if len(ran) + len(failed) < 10:
        print(f"FAIL: only {len(ran) + len(failed)} blocks found to run: the extraction is broken")
        sys.exit(1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
