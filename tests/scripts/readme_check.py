#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The README's and docs/'s promises, checked against the code (unit tier):

  - every in-page link [text](#anchor) resolves to a heading (GitHub's anchor rules: markup
    stripped, lower case, punctuation but '-' and '_' dropped, spaces to '-', repeats -1, -2);
    every relative file link names a file that exists, and where it names an anchor in a
    Markdown file (docs/relay.md#limits-of-the-relay, ../README.md#settings), that file has
    a heading with that anchor;
  - every NCCL_MESH_* the text names is a row of the settings table (nccl-mesh-info --settings,
    printed from src/config/config.cpp's table);
  - every command-line flag the text shows after one of the project's tools (nccl-mesh-info,
    nccl-mesh-perf, mesh_e2e, scripts/*: test.sh, fabric-net, vmesh, ...) is one the tool's
    --help names (subcommands' help included).

  readme_check.py --readme README.md --repo DIR --info BIN --perf BIN [--e2e BIN]
                  [--docs FILE ...] [--drop-section TITLE]
  readme_check.py --selftest

The files checked are the README and every docs/*.md under --repo (or the --docs given); each
is checked as the README is. --drop-section removes a section of the README (heading to the
next heading of its level or above) before checking, for the links within the README and for
those from the docs into it: a README with a deleted section must fail. Exit 0 when
everything holds, 1 with one line per problem ("README.md:LINE: ...", "docs/relay.md:LINE: ...").
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

FLAG = re.compile(r"(?<![\w/.-])(--?[A-Za-z][\w-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
MESH_SETTING = re.compile(r"\bNCCL_MESH_[A-Z0-9_]*[A-Z0-9]\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
TOOLS = ("nccl-mesh-info", "nccl-mesh-perf", "mesh_e2e")
STOP = {"--", "|", "||", "&&", ";", ">", ">>", "<", "2>&1", "&"}


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def blocks(lines):
    """(line number, text, in_code) for each line; fenced code blocks marked."""
    fence = None
    for n, line in enumerate(lines, 1):
        stripped = line.lstrip()
        marker = stripped[:3]
        if marker in ("```", "~~~") and (fence is None or marker == fence):
            fence = None if fence else marker
            yield n, line, True
            continue
        yield n, line, fence is not None


def strip_inline_code(line):
    return re.sub(r"`[^`]*`", "", line)


def anchors_of(lines):
    seen, anchors = {}, set()
    for _, line, code in blocks(lines):
        m = None if code else HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else "%s-%d" % (base, count))
    return anchors


def commands(lines):
    """(line number, command text): code lines (continuations joined) and inline code spans."""
    pending, start = "", 0
    for n, line, code in blocks(lines):
        if code:
            if line.lstrip().startswith(("```", "~~~")):
                continue
            if not pending:
                start = n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield start, pending + line
            pending = ""
        else:
            if line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|")):
                yield n, line  # an indented code block (or a deeply indented continuation)
            for span in re.findall(r"`([^`]+)`", line):
                yield n, span


def tool_of(token, scripts):
    base = token.rstrip(";").split("/")[-1]
    if base in TOOLS:
        return base
    if "scripts/" in token and base in scripts:
        return "scripts/" + base
    if base in ("fabric-net", "vmesh", "plot-perf.py"):
        return "scripts/" + base
    return None


def flags_used(text, scripts):
    """(tool, flag) for every flag given to one of the project's tools in a command text."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        tokens = text.split("#")[0].split()
    tool = None
    for token in tokens:
        named = tool_of(token, scripts)
        if named:
            tool = named
            continue
        if token in STOP or token.startswith(("#", "$(")):
            tool = None
            continue
        if tool and FLAG.fullmatch(token.split("=")[0]):
            yield tool, token.split("=")[0]
        if token.endswith(";"):
            tool = None


def markdown_anchors(path, texts):
    """The anchors of a Markdown file: its text as checked (texts: absolute path -> text, the
    README with a dropped section included), else as on disk; None when it cannot be read."""
    path = os.path.normpath(os.path.abspath(path))
    if path in texts:
        return anchors_of(texts[path].split("\n"))
    try:
        with open(path) as f:
            return anchors_of(f.read().split("\n"))
    except OSError:
        return None


def check(text, settings, helps, base_dir, scripts, texts=None):
    """The problems of a Markdown file's text, one string each. base_dir: the folder relative
    links start from; texts: the other files' texts as checked (absolute path -> text)."""
    texts = texts or {}
    lines = text.split("\n")
    problems = []
    anchors = anchors_of(lines)
    for n, line, code in blocks(lines):
        if code:
            continue
        for target in LINK.findall(strip_inline_code(line)):
            if target.startswith("#"):
                if target[1:] not in anchors:
                    problems.append("%d: dangling in-page link %s (no heading has that anchor)" % (n, target))
            elif not re.match(r"^[a-z]+:", target):
                file_part, _, anchor = target.partition("#")
                path = os.path.join(base_dir, file_part)
                if file_part and not os.path.exists(path):
                    problems.append("%d: link to %s, which does not exist" % (n, target))
                elif file_part and anchor and path.endswith(".md") and os.path.isfile(path):
                    there = markdown_anchors(path, texts)
                    if there is not None and anchor not in there:
                        problems.append("%d: dangling cross-file link %s (no heading of %s has the anchor #%s)"
                                        % (n, target, file_part, anchor))
    for n, line in enumerate(lines, 1):
        for name in MESH_SETTING.findall(line):
            if name not in settings:
                problems.append("%d: %s is not a setting (nccl-mesh-info --settings)" % (n, name))
    for n, cmd in commands(lines):
        for tool, flag in flags_used(cmd, scripts):
            accepted = helps.get(tool)
            if accepted is None:
                problems.append("%d: %s: no --help to check %s against" % (n, tool, flag))
            elif flag not in accepted:
                problems.append("%d: %s does not accept %s (not in its --help)" % (n, tool, flag))
    return problems


def check_files(files, settings, helps, scripts):
    """files: [(name to print, absolute path, text)]; every problem as "NAME:LINE: ..."."""
    texts = {os.path.normpath(path): text for _, path, text in files}
    problems = []
    for name, path, text in files:
        for p in check(text, settings, helps, os.path.dirname(path), scripts, texts):
            problems.append("%s:%s" % (name, p))
    return problems


def drop_section(text, title):
    lines = text.split("\n")
    out, level = [], None
    for _, line, code in blocks(lines):
        m = None if code else HEADING.match(line)
        if m and level is not None and len(m.group(1)) <= level:
            level = None
        if m and level is None and m.group(2) == title:
            level = len(m.group(1))
        if level is None:
            out.append(line)
    if len(out) == len(lines):
        sys.exit("readme_check: no section titled %r" % title)
    return "\n".join(out)


def run_help(argv):
    try:
        p = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return p.stdout + p.stderr, None


def tool_helps(args, scripts):
    """The flags each tool's --help names, subcommands' included."""
    here = os.path.join(args.repo, "scripts")
    runners = {"nccl-mesh-info": [args.info], "nccl-mesh-perf": [args.perf]}
    if args.e2e:
        runners["mesh_e2e"] = [args.e2e]
    for name in scripts:
        path = os.path.join(here, name)
        runners["scripts/" + name] = (["bash", path] if name.endswith(".sh") else
                                      [sys.executable, path] if name.endswith(".py") or name in ("fabric-net", "vmesh")
                                      else [path])
    helps = {}
    for tool, argv in runners.items():
        text, error = run_help(argv)
        if text is None:
            continue
        for sub in re.findall(r"\{([a-z,]+)\}", text.split("\n\n")[0]):
            for s in sub.split(","):
                more, _ = run_help(argv + [s])
                text += more or ""
        helps[tool] = set(FLAG.findall(text)) | {"-h", "--help"}
    return helps


def selftest():
    helps = {"nccl-mesh-info": {"--doctor", "--json", "--nodes", "-v"}, "scripts/fabric-net": {"--nodes", "--dropin"}}
    settings = {"NCCL_MESH_RELAY"}
    cases = [
        ("# Title\n## Use it\nsee [x](#use-it) and [t](#title)\n", 0),
        ("# A\n[gone](#dgx-spark-and-connectx-7)\n", 1),                        # a deleted section
        ("## Relay: rings, lines\n[r](#relay-rings-lines)\n", 0),
        ("## Topologies: `scripts/fabric-net`\n[t](#topologies-scriptsfabric-net)\n", 0),
        ("## X\n## X\n[second](#x-1)\n", 0),
        ("```sh\n# not a heading\n```\n[c](#not-a-heading)\n", 1),
        ("`NCCL_MESH_RELAY=auto` and `NCCL_MESH_NOPE`\n", 1),
        ("```sh\nnccl-mesh-info --doctor --nodes 3 --json   # --frob in a comment\n```\n", 0),
        ("```sh\nbuild/nccl-mesh-info --doctor \\\n    --frobnicate\n```\n", 1),
        ("`scripts/fabric-net run --nodes 3 --dropin -- build/nccl-mesh-info -v`\n", 0),
        ("`scripts/fabric-net run --nodes 3 -- mpirun --whatever`\n", 0),
        ("`nccl-mesh-info --json | jq .verdict`; prose `--anything` alone\n", 0),
        ("Usage:\n\n    scripts/fabric-net run --nodes 2 --flux\n", 1),               # indented code
    ]
    failed = 0
    for text, expected in cases:
        problems = check(text, settings, helps, ".", ["fabric-net"])
        if bool(problems) != bool(expected):
            failed += 1
            print("FAIL selftest: %r gave %s" % (text, problems or "no problem"))
    # Across files: a README and docs/*.md in a scratch tree; each case replaces one file's text.
    readme = "# T\n## Use it\n## DGX Spark and ConnectX-7\n### Cabling\nsee [d](docs/relay.md#relay-in-full)\n"
    relay = "# Relay\n## Relay in full\nback to [u](../README.md#use-it), [s](../README.md#dgx-spark-and-connectx-7)\n"
    cross = [
        (None, None, None, 0),                                                  # the tree as it is
        ("docs/relay.md", "[x](../README.md#no-such-section)\n", "cross-file", 1),  # a missing README anchor
        ("docs/relay.md", "[x](missing.md)\n", "does not exist", 1),                # a missing docs file
        ("docs/relay.md", "[x](missing.md#a)\n", "does not exist", 1),
        ("README.md", "[x](docs/relay.md#nowhere)\n", "cross-file", 1),            # a missing docs anchor
        ("README.md", "[x](docs/gone.md)\n", "does not exist", 1),
        ("README.md", "[x](docs/relay.md#relay-in-full) [y](docs/relay.md) [z](#t)\n", None, 0),
        ("docs/relay.md", "[x](fabric.md#the-fabric) [y](../README.md#cabling)\n", None, 0),
        ("docs/relay.md", "`[x](../README.md#inside-code)` and\n```\n[y](../README.md#nor-here)\n```\n", None, 0),
    ]
    with tempfile.TemporaryDirectory() as tree:
        os.mkdir(os.path.join(tree, "docs"))
        base = {"README.md": readme, "docs/relay.md": relay, "docs/fabric.md": "# The fabric\n"}
        for replace, text, word, expected in cross:
            files = dict(base)
            if replace:
                files[replace] = files[replace] + text
            for name, body in files.items():
                with open(os.path.join(tree, name), "w") as f:
                    f.write(body)
            problems = check_files([(n, os.path.join(tree, n), b) for n, b in files.items()], settings, helps, [])
            if bool(problems) != bool(expected) or (word and not any(word in p for p in problems)):
                failed += 1
                print("FAIL selftest: %s + %r gave %s" % (replace, text, problems or "no problem"))
        # The README with its DGX Spark section removed: the docs' link into it dangles.
        files = dict(base)
        files["README.md"] = drop_section(readme, "DGX Spark and ConnectX-7")
        problems = check_files([(n, os.path.join(tree, n), b) for n, b in files.items()], settings, helps, [])
        if not any("docs/relay.md:3: dangling cross-file link ../README.md#dgx-spark-and-connectx-7" in p
                   for p in problems):
            failed += 1
            print("FAIL selftest: a dropped README section gave %s" % (problems or "no problem"))
    total = len(cases) + len(cross) + 1
    print("readme_check selftest: %d of %d cases as expected" % (total - failed, total))
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme")
    parser.add_argument("--repo")
    parser.add_argument("--info")
    parser.add_argument("--perf")
    parser.add_argument("--e2e")
    parser.add_argument("--drop-section")
    parser.add_argument("--docs", nargs="*", help="the docs to check (default: every docs/*.md under --repo)")
    parser.add_argument("--selftest", action="store_true")
    args = parser.parse_args()
    if args.selftest:
        return selftest()
    if not (args.readme and args.repo and args.info and args.perf):
        parser.error("--readme, --repo, --info and --perf are needed")
    with open(args.readme) as f:
        text = f.read()
    if args.drop_section:
        text = drop_section(text, args.drop_section)
    readme = os.path.abspath(args.readme)
    files = [(os.path.basename(readme), readme, text)]
    docs = args.docs
    if docs is None:
        folder = os.path.join(args.repo, "docs")
        docs = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".md")) \
            if os.path.isdir(folder) else []
    for doc in docs:
        with open(doc) as f:
            files.append((os.path.relpath(os.path.abspath(doc), os.path.dirname(readme)), os.path.abspath(doc), f.read()))
    scripts = sorted(n for n in os.listdir(os.path.join(args.repo, "scripts"))
                     if os.path.isfile(os.path.join(args.repo, "scripts", n)))
    settings_out = subprocess.run([args.info, "--settings"], capture_output=True, text=True, timeout=30).stdout
    settings = set(re.findall(r"^\| `(NCCL_\w+)`", settings_out, re.M))
    if not settings:
        sys.exit("readme_check: %s --settings printed no table" % args.info)
    problems = check_files(files, settings, tool_helps(args, scripts), scripts)
    for p in problems:
        print(p)
    print("readme_check: %s: %d problem(s)%s" % (", ".join(name for name, _, _ in files), len(problems),
          " (section removed: %s)" % args.drop_section if args.drop_section else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
