"""Peer comparison for the ingest benchmark (bench/ingest.sh).

Runs aider's own fence-to-files parser (aider.coders.wholefile_coder.WholeFileCoder.get_edits,
the "whole" edit format: a file name on the line before each ``` fence) on the same document
cairn's parser read, times it, and compares the files both would write with cairn's dump
(`ingest_load parse --dump`).

Usage: python ingest_peer.py DOC OURS_JSON [REPS]
"""

import hashlib
import json
import sys
import time


def aider_edits(doc):
    """(seconds, [(path, content)]) from aider's WholeFileCoder.get_edits on `doc`."""
    from aider.coders.wholefile_coder import WholeFileCoder

    class Reply:
        # The attributes get_edits reads from a Coder; fence is aider's default ("```", "```").
        fence = ("```", "```")

        def get_multi_response_content_in_progress(self):
            return doc

        def get_inchat_relative_files(self):
            return []

        def abs_root_path(self, path):
            return path

    start = time.perf_counter()
    edits = WholeFileCoder.get_edits(Reply(), mode="update")
    seconds = time.perf_counter() - start
    return seconds, [(path, "".join(lines)) for path, _source, lines in edits]


def main():
    doc_path, ours_path = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    with open(doc_path, encoding="utf-8", newline="") as f:
        doc = f.read()
    runs = [aider_edits(doc) for _ in range(reps)]
    seconds = sorted(r[0] for r in runs)[len(runs) // 2]
    edits = runs[0][1]
    with open(ours_path) as f:
        ours = json.load(f)

    theirs = {}
    for path, content in edits:
        theirs[path] = hashlib.sha256(content.encode("utf-8")).hexdigest()
    written = {b["declared_file"]: b["sha256"] for b in ours["blocks"] if b["status"] == "written"}
    not_written = {b["declared_file"]: b["reason"] for b in ours["blocks"] if b["status"] != "written"}

    same = [p for p in written if theirs.get(p) == written[p]]
    differ = [p for p in written if p in theirs and theirs[p] != written[p]]
    only_ours = [p for p in written if p not in theirs]
    only_theirs = [p for p in theirs if p not in written]

    mb = ours["bytes"] / 1e6
    print(f"| aider-chat {aider_version()} WholeFileCoder.get_edits (Python {sys.version.split()[0]}) "
          f"| {mb / seconds:.0f} MB/s | cairn parse is {seconds / ours['seconds']:.1f}x faster |")
    print()
    print(f"Output on the same {mb:.0f} MB document: {len(written)} files written by cairn, {len(theirs)} by aider; "
          f"{len(same)} identical, {len(differ)} same path with different bytes, "
          f"{len(only_ours)} only cairn, {len(only_theirs)} only aider.")
    reasons = {}
    for p, r in not_written.items():
        reasons.setdefault(r, []).append(p)
    for reason, paths in sorted(reasons.items()):
        in_aider = sum(1 for p in paths if p in theirs)
        print(f"- cairn `{reason}`: {len(paths)} block(s), of which aider writes {in_aider} (e.g. `{paths[0]}`)")
    for label, paths in (("same path, different bytes", differ), ("only aider writes", only_theirs),
                         ("only cairn writes", only_ours)):
        if paths:
            print(f"- {label}: {len(paths)} (e.g. {', '.join('`' + p[:60] + '`' for p in paths[:3])})")


def aider_version():
    try:
        from importlib.metadata import version
        return version("aider-chat")
    except Exception:  # noqa: BLE001 - version is only decoration
        return "?"


if __name__ == "__main__":
    main()
