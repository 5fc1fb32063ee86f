"""Case package: data/prep is a Python package (pyproject.toml) installed by mpi_launch/install_prep.sh: its console
script, its metadata (the pins come from the requirements files), the wrapper, an up-to-date install that does
nothing, and how dflash_data import-prompts finds the tool ($DFLASH_PREP, then dflash-prep on PATH, then
data/prep/dflash-prep above the program, else a message saying so)."""
import os
import shutil
import subprocess
import tempfile
import time

from harness import A, expect, make_tokenizer, read_h5, write_jsonl

METADATA = """
import importlib.metadata as m
d = m.distribution("dflash-prep")
print("entry", [e.value for e in d.entry_points if e.name == "dflash-prep" and e.group == "console_scripts"])
for r in d.requires:
    print("requires", r)
"""


def run(cmd, env=None, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    print(f"$ {' '.join(map(str, cmd))}\n{p.stdout}{p.stderr}[exit {p.returncode}]")
    return p


def pins(path):
    return sorted(x.strip() for x in open(path) if x.strip() and not x.lstrip().startswith("#"))


def fake_prep(folder, name, marker, executable=True):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f'#!/usr/bin/env bash\necho "{marker} $*"\n')
    os.chmod(path, 0o755 if executable else 0o644)
    return path


def case_package():
    prep_dir = os.path.join(A.src, "data", "prep")
    venv = os.environ.get("DFLASH_PREP_VENV", os.path.join(prep_dir, ".venv"))
    script = os.path.join(venv, "bin", "dflash-prep")
    p = run([script, "--help"])
    expect(p.returncode == 0 and "tokenize" in p.stdout, f"the console script {script} does not run")
    p = run([os.path.join(prep_dir, "dflash-prep"), "tokenize", "--help"])
    expect(p.returncode == 0 and "--max-len" in p.stdout, "the wrapper data/prep/dflash-prep does not run")
    # the package's metadata: the console script, and exactly the pins of the requirements files
    p = run([os.path.join(venv, "bin", "python"), "-c", METADATA])
    expect("entry ['dflash_prep.__main__:main']" in p.stdout, "no console script dflash-prep in the metadata")
    requires = sorted(line[len("requires "):] for line in p.stdout.splitlines() if line.startswith("requires "))
    base = sorted(r for r in requires if "extra ==" not in r)
    serve = sorted(r.split(";")[0].strip() for r in requires if 'extra == "serve"' in r)
    expect(base == pins(os.path.join(prep_dir, "requirements.txt")), f"dependencies {base} != requirements.txt")
    expect(serve == pins(os.path.join(prep_dir, "requirements-serve.txt")),
           f"[serve] {serve} != requirements-serve.txt")
    expect(any('extra == "report"' in r and r.startswith("tensorboard==") for r in requires) and
           any('extra == "report"' in r and r.startswith("wandb==") for r in requires), "no [report] extra")
    # up to date: the installer only compares its stamp
    start = time.time()
    p = run(["bash", os.path.join(A.src, "mpi_launch", "install_prep.sh")])
    expect(p.returncode == 0 and "is up to date" in p.stdout and time.time() - start < 10,
           "install_prep.sh is not a quick no-op when up to date")

    # dflash_data import-prompts: which dflash-prep it runs
    dflash_data = os.path.join(A.build, "apps", "dflash_data")
    expect(os.path.exists(dflash_data), f"no {dflash_data}")
    base_env = {k: v for k, v in os.environ.items() if k not in ("DFLASH_PREP", "DFLASH_PREP_VENV")}
    base_env["PATH"] = "/usr/bin:/bin"
    bin_dir = os.path.join(A.work, "bin")
    fake_prep(bin_dir, "dflash-prep", "FAKE-ON-PATH")
    env_prep = fake_prep(os.path.join(A.work, "env"), "my-prep", "FAKE-ENV")
    plain_prep = fake_prep(os.path.join(A.work, "plain"), "my-prep", "FAKE-PLAIN", executable=False)
    on_path = dict(base_env, PATH=bin_dir + ":/usr/bin:/bin")
    for env, want in ((on_path, "FAKE-ON-PATH prompts in.jsonl --out x"),
                      (dict(on_path, DFLASH_PREP=env_prep), "FAKE-ENV prompts in.jsonl --out x"),
                      (dict(on_path, DFLASH_PREP=plain_prep), "FAKE-PLAIN prompts in.jsonl --out x")):
        p = run([dflash_data, "import-prompts", "in.jsonl", "--out", "x"], env=env)
        expect(p.returncode == 0 and want in p.stdout, f"expected {want!r}")
    # the installed console script on PATH does the real work
    tok_dir, _ = make_tokenizer()
    src = write_jsonl("prompts.jsonl", [{"prompt": "Hello"}, {"question": "What is two plus two?"}])
    out = os.path.join(A.work, "prompts.h5")
    p = run([dflash_data, "import-prompts", src, "--tokenizer", tok_dir, "--out", out],
            env=dict(base_env, PATH=os.path.join(venv, "bin") + ":/usr/bin:/bin"))
    expect(p.returncode == 0 and len(read_h5(out)) == 2, "import-prompts through the console script on PATH")
    # none anywhere: the program copied outside any source tree, nothing on PATH
    with tempfile.TemporaryDirectory() as lone:
        copy = shutil.copy(dflash_data, os.path.join(lone, "dflash_data"))
        p = run([copy, "import-prompts", src, "--out", out], env=base_env, cwd=lone)
        expect(p.returncode != 0 and "found none: DFLASH_PREP is not set, no dflash-prep on PATH" in
               p.stdout + p.stderr, "no clear message when no dflash-prep is found")
    print("PASS (package)")
