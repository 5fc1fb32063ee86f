#!/usr/bin/env python3
"""The folder layers of docs/architecture.md hold: a file of lib/ or kernels/ includes only its own folder and the
folders listed before it in that page's layer table (lowest first), so the folders have no back edge and no cycle.
Usage: check_layers.py REPO_ROOT; exit 1 naming each file, its include and the two layers.
"""
import os
import re
import sys


def layers(root):
    """The layer folders, lowest first, from the table rows "| `lib/core` | ..." of docs/architecture.md."""
    text = open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8").read()
    return [m.group(1).rstrip("/") for m in re.finditer(r"^\| `((?:lib|kernels)[\w/]*)` \|", text, re.M)]


def layer_of(path, order):
    best = None  # the longest folder that holds the path (kernels/cuda/emu before kernels)
    for folder in order:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    order = layers(root)
    if len(order) < 5:
        sys.exit(f"check_layers.py: found only {order} in docs/architecture.md's layer table")
    bad = 0
    for top in ("lib", "kernels"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                mine = layer_of(path, order)
                text = open(os.path.join(root, path), encoding="utf-8").read()
                for m in re.finditer(r'^#include "([^"]+)"', text, re.M):
                    theirs = layer_of(m.group(1), order)
                    if mine and theirs and order.index(theirs) > order.index(mine) and not theirs.startswith(mine):
                        print(f"{path}: includes {m.group(1)}: {mine} may include only the layers before it "
                              f"(docs/architecture.md), not {theirs}")
                        bad += 1
    print(f"check_layers: {len(order)} layers ({', '.join(order)}), {bad} back edges")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
