"""Maintainer command: regenerate the stored reference outputs from independent references.

    python tests/references/make.py            # rewrite tests/references/
    python tests/references/make.py --check    # regenerate into a temp folder and compare (CI runs this)

Each `tests/references/make_*.py` module defines `build(out_dir)`, which writes its files into
out_dir using only code nobody here wrote (transformers, tiktoken, the safetensors package,
torch.nn.functional) on seeded inputs.
"""
from __future__ import annotations

import argparse
import filecmp
import importlib.util
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def builders():
    for fname in sorted(os.listdir(HERE)):
        if fname.startswith("make_") and fname.endswith(".py"):
            spec = importlib.util.spec_from_file_location(fname[:-3], os.path.join(HERE, fname))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            yield fname, mod.build


def build_all(out_dir: str) -> None:
    for fname, build in builders():
        print(f"[references] {fname}", file=sys.stderr)
        build(out_dir)


def compare(a: str, b: str) -> list[str]:
    """Relative paths whose content differs between folders a and b (files under a only)."""
    differ = []
    for root, _, files in os.walk(a):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), a)
            other = os.path.join(b, rel)
            if not os.path.exists(other) or not filecmp.cmp(os.path.join(root, f), other, shallow=False):
                differ.append(rel)
    return sorted(differ)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    if not args.check:
        build_all(HERE)
        return
    with tempfile.TemporaryDirectory() as tmp:
        build_all(tmp)
        differ = compare(tmp, HERE)
    if differ:
        print("references differ from a regeneration: " + ", ".join(differ))
        sys.exit(1)
    print("references match a regeneration")


if __name__ == "__main__":
    main()
