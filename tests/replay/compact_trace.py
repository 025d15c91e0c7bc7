#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""compact_trace.py: rewrites a trace recorded before the recorder folded repeated setNetAttr
calls (src/abi/trace.cpp, Tracer::emit) the way the recorder now writes them: a setnetattr
record followed, with no other record between, by identical ones (same thread, context,
version and result) keeps its time and gets again=N for the N that followed; those are
dropped. mesh_replay replays again=N as N more calls, so the replay is the same call for call.
Records are then numbered 1, 2, 3... as the recorder numbers them (the parser takes a gap for
a lost line). Every other line is left as it is.

    tests/replay/compact_trace.py IN.trace OUT.trace
"""
import sys


def key(fields):
    """(thread, ctx, v, r) of a setnetattr record without again=, else None."""
    if len(fields) < 4 or fields[3] != "setnetattr":
        return None
    args = dict(f.split("=", 1) for f in fields[4:] if "=" in f)
    if "again" in args:
        return None
    return (fields[2], args.get("ctx"), args.get("v"), args.get("r"))


def compact(lines):
    out, held, held_key, again, in_records = [], None, None, 0, False

    def flush():
        nonlocal held, held_key, again
        if held is not None:
            out.append(held + (f" again={again}" if again else ""))
        held, held_key, again = None, None, 0

    for line in lines:
        text = line.rstrip("\n")
        if not in_records:
            out.append(text)
            in_records = text == "records"
            continue
        k = key(text.split())
        if k is not None and k == held_key:
            again += 1
            continue
        flush()
        if k is not None:
            held, held_key = text, k
        else:
            out.append(text)
    flush()
    return renumber(out)


def renumber(lines):
    out, seq, in_records = [], 0, False
    for text in lines:
        fields = text.split(" ", 1)
        if in_records and fields[0].isdigit():
            seq += 1
            text = str(seq) + (" " + fields[1] if len(fields) > 1 else "")
        out.append(text)
        in_records = in_records or text == "records"
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        lines = compact(f)
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
