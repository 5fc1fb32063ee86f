#!/usr/bin/env python3
"""Every repository path written in a file of the repository (a comment, a doc, a message) names something that
exists.

A path is a word that starts with one of the repository's top-level folders (lib/, kernels/, docs/, ...). It exists
when it is a tracked file or folder; a glob or brace list (`lib/state/{checkpoint,step_dump}.*`) when every
alternative matches one; a stem (`lib/model/target_shard`) when a tracked file is that stem plus an extension; a
build output (`tests/cuda/dflash_cuda_tests`) when its folder is tracked and its name is an add_executable target.
A document named without its folder (`eval.md`, `NOTES.md`) must be a tracked document's name: users have no other.
Not checked: what git ignores (virtual environments, build folders) and data files (*.h5, *.jsonl: the examples'
user data). Usage: check_repo_paths.py REPO_ROOT; exit 1 listing file:line and the path, 77 outside a git checkout.
"""
import fnmatch
import os
import re
import subprocess
import sys

DATA_SUFFIXES = (".h5", ".jsonl")
BINARY_SUFFIXES = (".safetensors", ".h5", ".bin", ".png")


def git(root, *args, stdin=None):
    return subprocess.run(["git", "-C", root, *args], input=stdin, capture_output=True, text=True)


def expand(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",") for p in expand(path[: m.start()] + alt + path[m.end():])]


class Tree:
    def __init__(self, files, targets):
        self.files = set(files)
        self.dirs = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
        self.stems = {os.path.splitext(f)[0] for f in files}
        self.targets = targets
        tops = sorted({f.split("/")[0] for f in files if "/" in f})
        # a path: a top-level folder, '/', then path characters; not inside another word or path ($DIR/lib/...)
        self.pattern = re.compile(r"(?<![\w./$-])((?:%s)/[\w.*{},/-]*[\w*}/])" % "|".join(map(re.escape, tops)))
        self.docs = {os.path.basename(f) for f in files if f.endswith(".md")}
        self.doc_pattern = re.compile(r"(?<![\w./$-])([A-Za-z_][\w-]*\.md)\b")

    def exists(self, path):
        path = path.rstrip("/")
        if "*" in path:
            return any(fnmatch.fnmatchcase(p, path) for p in self.files | self.dirs)
        if path in self.files or path in self.dirs or path in self.stems:
            return True
        folder, name = os.path.split(path)
        return folder in self.dirs and name in self.targets

    def missing_in(self, text):
        """(line number, path) of every path in text that names nothing."""
        out = []
        for n, line in enumerate(text.split("\n"), 1):
            for m in self.pattern.finditer(line):
                path = m.group(1).rstrip(".,:;")
                if path.count("{") < path.count("}"):  # `{path: data/x}`: the brace closes the text around it
                    path = path[: path.rindex("}")]
                if path.endswith(DATA_SUFFIXES) or all(self.exists(p) for p in expand(path)):
                    continue
                out.append((n, path))
            out += [(n, m.group(1)) for m in self.doc_pattern.finditer(line) if m.group(1) not in self.docs]
        return out


def cmake_targets(root, files):
    names = set()
    for f in files:
        if os.path.basename(f) == "CMakeLists.txt":
            names.update(re.findall(r"add_executable\(\s*([\w-]+)", open(os.path.join(root, f)).read()))
    return names


def self_test():
    tree = Tree(["lib/core/error.h", "lib/state/checkpoint.cpp", "tests/cuda/main.cpp", "docs/eval.md"],
                {"dflash_cuda_tests"})
    text = ("// lib/core/error.h, lib/core/{error}.h, lib/state/checkpoint, tests/cuda/dflash_cuda_tests, eval.md exist;\n"
            "// lib/core/no_such_file.h, lib/state/{checkpoint,gone}.*, NOTES.md and $BUILD/lib/x do not (the last is "
            "not ours)")
    got = tree.missing_in(text)
    want = [(2, "lib/core/no_such_file.h"), (2, "lib/state/{checkpoint,gone}.*"), (2, "NOTES.md")]
    if got != want:
        sys.exit(f"check_repo_paths.py: self-test failed: found {got}, expected {want}")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    self_test()
    # tracked files and the new ones git does not ignore, as they are in the working tree
    listed = git(root, "ls-files", "--cached", "--others", "--exclude-standard")
    if listed.returncode != 0:
        print(f"skipped: {root} is not a git checkout (git ls-files: {listed.stderr.strip()})")
        return 77
    files = [f for f in listed.stdout.split("\n")[:-1] if os.path.isfile(os.path.join(root, f))]
    tree = Tree(files, cmake_targets(root, files))
    bad = []
    for f in files:
        if f.endswith(BINARY_SUFFIXES) or f == "tests/check_repo_paths.py":  # this file names missing paths on purpose
            continue
        try:
            text = open(os.path.join(root, f), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        bad += [(f, n, p) for n, p in tree.missing_in(text)]
    # what git ignores is made locally (data/prep/.venv, build folders): not a repository path
    if bad:
        queries = sorted({q for _, _, p in bad for q in (p, p.rstrip("/") + "/x")})
        ignored = set(git(root, "check-ignore", "--stdin", stdin="\n".join(queries)).stdout.split("\n"))
        bad = [b for b in bad if b[2] not in ignored and b[2].rstrip("/") + "/x" not in ignored]
    for f, n, p in bad:
        print(f"{f}:{n}: {p}: no such file or folder in the repository")
    print(f"check_repo_paths: {len(files)} tracked files read, {len(bad)} paths that name nothing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
