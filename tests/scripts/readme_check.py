#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The README's promises, checked against the code (unit tier):

  - every in-page link [text](#anchor) resolves to a heading (GitHub's anchor rules: markup
    stripped, lower case, punctuation but '-' and '_' dropped, spaces to '-', repeats -1, -2);
    every relative file link names a file that exists;
  - every NCCL_MESH_* the text names is a row of the settings table (nccl-mesh-info --settings,
    printed from src/config/config.cpp's table);
  - every command-line flag the text shows after one of the project's tools (nccl-mesh-info,
    nccl-mesh-perf, mesh_e2e, scripts/*: test.sh, fabric-net, vmesh, ...) is one the tool's
    --help names (subcommands' help included).

  readme_check.py --readme README.md --repo DIR --info BIN --perf BIN [--e2e BIN] [--drop-section TITLE]
  readme_check.py --selftest

--drop-section removes a section (heading to the next heading of its level or above) before
checking: a README with a deleted section must fail. Exit 0 when everything holds, 1 with one
line per problem ("README.md:LINE: ...").
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

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


def check(text, settings, helps, repo, readme_dir, scripts):
    """The problems of a README's text, one string each."""
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
                path = os.path.join(readme_dir, target.split("#")[0])
                if target.split("#")[0] and not os.path.exists(path):
                    problems.append("%d: link to %s, which does not exist" % (n, target))
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
        problems = check(text, settings, helps, ".", ".", ["fabric-net"])
        if bool(problems) != bool(expected):
            failed += 1
            print("FAIL selftest: %r gave %s" % (text, problems or "no problem"))
    print("readme_check selftest: %d of %d cases as expected" % (len(cases) - failed, len(cases)))
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme")
    parser.add_argument("--repo")
    parser.add_argument("--info")
    parser.add_argument("--perf")
    parser.add_argument("--e2e")
    parser.add_argument("--drop-section")
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
    scripts = sorted(n for n in os.listdir(os.path.join(args.repo, "scripts"))
                     if os.path.isfile(os.path.join(args.repo, "scripts", n)))
    settings_out = subprocess.run([args.info, "--settings"], capture_output=True, text=True, timeout=30).stdout
    settings = set(re.findall(r"^\| `(NCCL_\w+)`", settings_out, re.M))
    if not settings:
        sys.exit("readme_check: %s --settings printed no table" % args.info)
    problems = check(text, settings, tool_helps(args, scripts), args.repo, os.path.dirname(os.path.abspath(args.readme)), scripts)
    name = os.path.basename(args.readme)
    for p in problems:
        print("%s:%s" % (name, p))
    print("readme_check: %s: %d problem(s)%s" % (name, len(problems), " (section removed: %s)" % args.drop_section if args.drop_section else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
