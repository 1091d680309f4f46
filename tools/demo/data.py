"""The demo model's training text: the Python sources and docs installed on the machine that trains it.

    python -m tools.demo.data --out DIR [--max-mb 256] [--seed 0]     # writes DIR/data.json and DIR/heldout.txt

Files (*.py, *.md, *.rst, *.txt) under the standard library (sysconfig's `stdlib`) and every site-packages directory
(site.getsitepackages(), sysconfig's purelib/platlib, the user site), named `stdlib/<relative path>` or
`site-packages/<relative path>`. Skipped: caches, hidden and *.dist-info/*.egg-info directories, files over 512 KiB,
files that are not UTF-8, empty files, and exact duplicates of a file already taken. The files are visited in a seeded
order (sha256 of seed and name, so no library version changes it) until --max-mb is reached; each one taken goes to
the held-out split when the sha256 of its name falls in the first 2% of the hash range, so the split is the same on
every machine with the same files, whatever the seed or cap. The recipe (roots, counts, bytes, sha256 of both texts)
goes to data.json, the held-out files, in name order and joined by a blank line, to heldout.txt.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import site
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

EXTENSIONS = (".py", ".md", ".rst", ".txt")
MAX_FILE_BYTES = 512 * 1024
HELDOUT_PER_10000 = 200  # 2% of the files
SEPARATOR = "\n\n"  # between the files of heldout.txt (and of the texts whose sha256 the recipe records)
_SKIP_DIRS = ("__pycache__", "site-packages", "dist-packages")  # the last two: site roots nested in the stdlib


@dataclass
class Doc:
    name: str  # "<root label>/<path relative to the root>"
    text: str


@dataclass
class Corpus:
    train: list[Doc]  # in the seeded order
    heldout: list[Doc]  # in name order
    recipe: dict = field(default_factory=dict)

    def heldout_text(self) -> str:
        return SEPARATOR.join(d.text for d in self.heldout)


def default_roots() -> list[tuple[str, Path]]:
    """(label, directory): the standard library, then every site-packages directory of this interpreter."""
    paths = sysconfig.get_paths()
    sites = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        sites.add(site.getusersitepackages())
    roots = [("stdlib", Path(paths["stdlib"]).resolve())]
    for p in sorted(sites):
        path = Path(p).resolve()
        if path.is_dir() and all(path != r for _, r in roots):
            roots.append(("site-packages", path))
    return roots


def is_heldout(name: str) -> bool:
    h = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    return h % 10000 < HELDOUT_PER_10000


def _skip_dir(name: str) -> bool:
    return name.startswith(".") or name in _SKIP_DIRS or name.endswith((".dist-info", ".egg-info"))


def _candidates(roots: list[tuple[str, Path]]) -> dict[str, tuple[str, Path]]:
    """name -> (root, file) for every file of a wanted kind; where two roots give one name the first root wins."""
    found: dict[str, tuple[str, Path]] = {}
    for label, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not _skip_dir(d))
            for f in sorted(filenames):
                if f.endswith(EXTENSIONS):
                    path = Path(dirpath, f)
                    found.setdefault(f"{label}/{path.relative_to(root).as_posix()}", (str(root), path))
    return found


def _order_key(seed: int, name: str) -> bytes:
    return hashlib.sha256(f"{seed}:{name}".encode("utf-8")).digest()


def gather(max_mb: float, seed: int = 0, roots: list[tuple[str, Path]] | None = None) -> Corpus:
    roots = roots if roots is not None else default_roots()
    found = _candidates(roots)
    max_bytes = int(max_mb * 2**20)
    skipped: Counter = Counter()
    seen_content: set[bytes] = set()
    per_root: dict[str, Counter] = {str(r): Counter() for _, r in roots}
    extensions: Counter = Counter()
    train: list[Doc] = []
    heldout: list[Doc] = []
    split_bytes = {"train": 0, "heldout": 0}
    total = 0
    capped = False
    for name in sorted(found, key=lambda n: _order_key(seed, n)):
        if total >= max_bytes:
            capped = True
            break
        root, path = found[name]
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                skipped["too_large"] += 1
                continue
            raw = path.read_bytes()
        except OSError:
            skipped["unreadable"] += 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped["not_utf8"] += 1
            continue
        if not text.strip():
            skipped["empty"] += 1
            continue
        digest = hashlib.sha256(raw).digest()
        if digest in seen_content:
            skipped["duplicate"] += 1
            continue
        seen_content.add(digest)
        split = "heldout" if is_heldout(name) else "train"
        (heldout if split == "heldout" else train).append(Doc(name, text))
        total += len(raw)
        split_bytes[split] += len(raw)
        per_root[root].update(files=1, bytes=len(raw))
        extensions[path.suffix] += 1
    heldout.sort(key=lambda d: d.name)
    corpus = Corpus(train, heldout)
    corpus.recipe = {
        "what": "Python sources and docs of the standard library and the installed packages",
        "python": platform.python_version(),
        "prefix": sys.prefix,
        "seed": seed,
        "max_mb": max_mb,
        "capped": capped,
        "extensions": list(EXTENSIONS),
        "max_file_bytes": MAX_FILE_BYTES,
        "heldout_rule": f"sha256(name)[:8] as big-endian integer % 10000 < {HELDOUT_PER_10000}",
        "order_rule": "sha256(f'{seed}:{name}'), ascending",
        "separator": SEPARATOR,
        "roots": [{"label": label, "path": str(r), **per_root[str(r)]} for label, r in roots],
        "candidates": len(found),
        "skipped": dict(sorted(skipped.items())),
        "files": {"train": len(train), "heldout": len(heldout)},
        "files_by_extension": dict(sorted(extensions.items())),
        "bytes": split_bytes,
        "sha256": {"train": _sha256_joined(train), "heldout": _sha256_joined(heldout)},
    }
    return corpus


def _sha256_joined(docs: list[Doc]) -> str:
    h = hashlib.sha256()
    for i, d in enumerate(docs):
        if i:
            h.update(SEPARATOR.encode("utf-8"))
        h.update(d.text.encode("utf-8"))
    return h.hexdigest()


def write(corpus: Corpus, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "data.json").write_text(json.dumps(corpus.recipe, indent=1) + "\n", encoding="utf-8")
    with open(out_dir / "heldout.txt", "w", encoding="utf-8", newline="") as f:
        f.write(corpus.heldout_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--max-mb", type=float, default=256.0, help="stop taking files past this many MiB")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    corpus = gather(args.max_mb, args.seed)
    write(corpus, args.out)
    r = corpus.recipe
    print(f"data: {r['files']['train']} train files ({r['bytes']['train']} bytes), {r['files']['heldout']} held-out "
          f"({r['bytes']['heldout']} bytes, sha256 {r['sha256']['heldout'][:16]}), skipped {r['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
