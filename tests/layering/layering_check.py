#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The modules' include order, checked (unit tier).

src/modules.cmake is the one table of the modules, lowest first: mesh_module(NAME [OBJECT]
[USES MODULE...]). A module's files are src/NAME/ and include/mesh/NAME/; it may include its
own headers and those of the modules it USES, directly or through the modules those use.
This check reads every #include of every file under src/ and include/ and fails on one that
reaches another module's header against that table, naming the file, the line and both
modules. It also fails on a source or header outside any module folder, a module folder
the table does not name, and a table whose USES name a module not listed above it (so the
order has no cycle).

  layering_check.py --root DIR           check DIR's tree; exit 0, or 1 with one line a problem
  layering_check.py --root DIR --graph   print which modules each module's includes reach
  layering_check.py --selftest           synthetic trees: a clean one passes; an upward, a
                                         sideways and a stray include each fail as they should

Includes are resolved as the compiler would: "mesh/M/x.h" is module M's header; a quoted
include found beside the including file is that file's module; anything else (the C++ and
system headers, NCCL's ABI headers in nccl/, generated files) belongs to no module.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

TABLE = os.path.join("src", "modules.cmake")
ENTRY = re.compile(r"^\s*mesh_module\(\s*([a-z_][a-z0-9_]*)\b([^)]*)\)", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCE_EXT = (".h", ".hpp", ".c", ".cc", ".cpp", ".inc")


def read_table(root):
    """(order, uses): the modules lowest first and the set each may use (transitively),
    plus the problems of the table itself."""
    problems = []
    path = os.path.join(root, TABLE)
    try:
        text = open(path).read()
    except OSError as e:
        return [], {}, ["%s: cannot read the module table: %s" % (TABLE, e)]
    order, uses = [], {}
    for m in ENTRY.finditer(text):
        name, rest = m.group(1), m.group(2).split()
        line = text.count("\n", 0, m.start()) + 1
        direct = rest[rest.index("USES") + 1:] if "USES" in rest else []
        if name in uses:
            problems.append("%s:%d: module %s is listed twice" % (TABLE, line, name))
            continue
        reach = set()
        for used in direct:
            if used not in uses:
                problems.append("%s:%d: %s uses %s, which is not listed above it (the table "
                                "goes lowest first, so it has no cycle)" % (TABLE, line, name, used))
                continue
            reach |= {used} | uses[used]
        order.append(name)
        uses[name] = reach
    if not order:
        problems.append("%s: no mesh_module() entry" % TABLE)
    return order, uses, problems


def module_of(rel, modules):
    """The module a path (relative to the root, '/'-separated) belongs to, or None."""
    parts = rel.split("/")
    if len(parts) >= 3 and parts[0] == "src" and parts[1] in modules:
        return parts[1]
    if len(parts) >= 4 and parts[:2] == ["include", "mesh"] and parts[2] in modules:
        return parts[2]
    return None


def tree_files(root):
    for top in ("src", "include"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")


def target_of(root, rel, kind, name, modules):
    """(module, problem) of what `#include <name>` in file rel reaches; (None, None) when it
    is no module's."""
    if name.startswith("mesh/"):
        parts = name.split("/")
        if len(parts) >= 3 and parts[1] in modules:
            return parts[1], None
        return None, '"%s" is not a module\'s header (mesh/<module>/<file>; modules: %s)' % (
            name, ", ".join(modules))
    if kind == '"':
        beside = os.path.normpath(os.path.join(os.path.dirname(rel), name)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, beside)):
            module = module_of(beside, modules)
            if module is None and beside.startswith(("src/", "include/", "tests/")):
                return None, '"%s" is %s, outside every module' % (name, beside)
            return module, None
    return None, None


def check(root):
    """The problems of the tree at root, one line each."""
    order, uses, problems = read_table(root)
    if not order:
        return problems
    modules = set(order)
    for top in ("src", os.path.join("include", "mesh")):
        base = os.path.join(root, top)
        for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            if os.path.isdir(os.path.join(base, entry)) and entry not in modules:
                problems.append("%s/%s/: a folder that is no module of %s" % (top.replace(os.sep, "/"), entry, TABLE))
    rank = {name: i for i, name in enumerate(order)}
    for rel in tree_files(root):
        own = module_of(rel, modules)
        if own is None:
            problems.append("%s: not in a module's folder (src/<module>/ or include/mesh/<module>/)" % rel)
            continue
        with open(os.path.join(root, rel), errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target, problem = target_of(root, rel, m.group(1), m.group(2), order)
                if problem:
                    problems.append("%s:%d: %s" % (rel, n, problem))
                    continue
                if target is None or target == own or target in uses[own]:
                    continue
                where = ("an upward include: %s is above %s" % (target, own) if rank[target] > rank[own]
                         else "%s is beside %s, not under it" % (target, own))
                allowed = ", ".join(sorted(uses[own], key=rank.get)) or "nothing"
                problems.append("%s:%d: module %s includes %s of module %s (%s; %s may use: %s; see %s)" % (
                    rel, n, own, m.group(2), target, where, own, allowed, TABLE))
    return problems


def graph(root):
    """{module: {modules its includes reach directly}}, measured."""
    order, _, _ = read_table(root)
    modules = set(order)
    reach = {name: set() for name in order}
    for rel in tree_files(root):
        own = module_of(rel, modules)
        if own is None:
            continue
        with open(os.path.join(root, rel), errors="replace") as f:
            for line in f:
                m = INCLUDE.match(line)
                target = m and target_of(root, rel, m.group(1), m.group(2), order)[0]
                if target and target != own:
                    reach[own].add(target)
    return order, reach


# --- the self-test: synthetic trees -------------------------------------------------------

SYNTHETIC_TABLE = """# a synthetic table
mesh_module(base)
mesh_module(low   USES base)
mesh_module(side  USES base)
mesh_module(high  USES low)   # and, through low, base
"""

SYNTHETIC_FILES = {
    "include/mesh/base/b.h": "#pragma once\n#include <cstdint>\n#include \"err.h\"\n",
    "src/base/b.cpp": "#include \"mesh/base/b.h\"\n",
    "include/mesh/low/l.h": "#pragma once\n#include \"mesh/base/b.h\"\n",
    "src/low/l.cpp": "#include \"mesh/low/l.h\"\n#include \"private.h\"\n",
    "src/low/private.h": "#pragma once\n",
    "include/mesh/side/s.h": "#pragma once\n",
    "src/side/s.cpp": "#include \"mesh/side/s.h\"\n#include \"mesh/base/b.h\"\n",
    "src/high/h.cpp": "#include \"mesh/low/l.h\"\n#include \"mesh/base/b.h\"  // through low\n",
}

# (what, extra files, table or None, the problems' text must match all of these, count)
SYNTHETIC_CASES = [
    ("a clean tree", {}, None, [], 0),
    ("an upward include", {"src/low/up.cpp": "// low reaching up\n#include <vector>\n#include \"mesh/high/h.h\"\n",
                           "include/mesh/high/h.h": "#pragma once\n"}, None,
     [r"^src/low/up\.cpp:3: module low includes mesh/high/h\.h of module high \(an upward include: high is above low;"
      r" low may use: base; see src/modules\.cmake\)$"], 1),
    ("a sideways include", {"src/high/x.cpp": "#include \"mesh/side/s.h\"\n"}, None,
     [r"^src/high/x\.cpp:1: module high includes mesh/side/s\.h of module side \(side is beside high"], 1),
    ("a relative include into a module above", {"src/base/rel.cpp": "#include \"../low/private.h\"\n"}, None,
     [r"^src/base/rel\.cpp:1: module base includes \.\./low/private\.h of module low \(an upward include"], 1),
    ("a header outside the module folders", {"include/mesh/flat.h": "#pragma once\n",
                                             "src/low/f.cpp": "#include \"mesh/flat.h\"\n"}, None,
     [r"^include/mesh/flat\.h: not in a module's folder", r"^src/low/f\.cpp:1: \"mesh/flat\.h\" is not a module's header"], 2),
    ("a folder the table does not name", {"src/extra/e.cpp": "int e;\n"}, None,
     [r"^src/extra/: a folder that is no module", r"^src/extra/e\.cpp: not in a module's folder"], 2),
    ("a table that uses a module above", {}, SYNTHETIC_TABLE.replace("mesh_module(low   USES base)",
                                                                     "mesh_module(low   USES high)"),
     [r"^src/modules\.cmake:3: low uses high, which is not listed above it"], None),
]


def make_tree(files, table):
    root = tempfile.mkdtemp(prefix="layering-selftest.")
    for rel, text in [(TABLE, table)] + sorted(files.items()):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


def selftest():
    failed = 0
    for what, extra, table, expected, count in SYNTHETIC_CASES:
        root = make_tree(dict(SYNTHETIC_FILES, **extra), table or SYNTHETIC_TABLE)
        try:
            problems = check(root)
        finally:
            shutil.rmtree(root)
        print("-- %s: %s" % (what, "%d problem(s)" % len(problems) if problems else "passes"))
        for p in problems:
            print("   " + p)
        ok = (count is None or len(problems) == count) and all(
            any(re.search(e, p) for p in problems) for e in expected)
        if not ok:
            failed += 1
            print("FAIL layering selftest: %s: expected %s problem(s) matching %s" % (what, count, expected))
    print("layering selftest: %d of %d cases as expected" % (len(SYNTHETIC_CASES) - failed, len(SYNTHETIC_CASES)))
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="the repository (src/modules.cmake, src/, include/)")
    parser.add_argument("--graph", action="store_true", help="print the measured module graph")
    parser.add_argument("--selftest", action="store_true")
    args = parser.parse_args()
    if args.selftest:
        return selftest()
    if not args.root:
        parser.error("--root or --selftest is needed")
    if args.graph:
        order, reach = graph(args.root)
        for name in order:
            print("%-10s includes %s" % (name, ", ".join(m for m in order if m in reach[name]) or "-"))
        return 0
    problems = check(args.root)
    for p in problems:
        print(p)
    order, _, _ = read_table(args.root)
    files = sum(1 for _ in tree_files(args.root))
    print("layering_check: %s (%d modules, %d files under src/ and include/)" % (
        "OK" if not problems else "%d problem(s)" % len(problems), len(order), files))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
