"""layers.py - checks that src/'s files stand on each other in the Makefile's order.

Each file of SRCS (the Makefile's source list) may call only functions defined in files listed
before it. Calls are counted by name: every cm_*/cmalloc_* identifier followed by "(" in a
file's code (comments removed), including the calls of the inline functions of the headers it
includes (fastpath.h, internal.h), resolved to the .c file that defines the function (a
definition starts in the first column; an indented call whose arguments end a line in "{", as
an if's condition does, is a call).
Exempt, as the layering allows: calls to cm_init (lazy initialisation, started from whatever
entry point comes first) and init.c's calls of every layer's *_fork and *_init hooks (the top
calling down in order, at start and around fork). Prints each call that goes up, and exits 1
when there is one.
"""
import os
import re
import sys

CALL = re.compile(r"\b(cm_\w+|cmalloc_\w+)\s*\(")
DEFINITION = re.compile(r"^(?=\S)[\w\s\*]*?\b(cm_\w+|cmalloc_\w+)\s*\([^;{]*\)\s*\{", re.M)


def code(path):
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def sources():
    """The Makefile's SRCS, in order."""
    makefile = open("Makefile").read()
    match = re.search(r"^SRCS\s*:=\s*((?:.*\\\n)*.*)$", makefile, re.M)
    words = match.group(1).replace("\\", " ").split()
    return [word for word in words if word.endswith(".c")]


def inline_calls(header):
    """Calls made by each inline function of a header, by function name."""
    calls = {}
    for match in re.finditer(r"static inline [^(]*?\b(cm_\w+)\s*\([^)]*\)\s*\{", header):
        depth, i = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(header[i], 0)
            i += 1
        calls[match.group(1)] = set(CALL.findall(header[match.end():i]))
    return calls


def main():
    srcs = sources()
    order = {os.path.basename(path): index for index, path in enumerate(srcs)}
    defined = {}
    for path in srcs:
        for name in DEFINITION.findall(code(path)):
            defined.setdefault(name, os.path.basename(path))
    inline = {}
    for header in ("src/internal.h", "src/fastpath.h"):
        inline.update(inline_calls(code(header)))
    upward = []
    for path in srcs:
        me = os.path.basename(path)
        names, seen = set(CALL.findall(code(path))), set()
        while names - seen:  # follow inline functions to what they call
            name = (names - seen).pop()
            seen.add(name)
            names |= inline.get(name, set())
        for name in sorted(names):
            home = defined.get(name)
            if home is None or home == me or order[home] < order[me]:
                continue
            if name == "cm_init" or (me == "init.c" and re.search(r"_(fork|init)$", name)):
                continue
            upward.append(f"{me} calls {name} ({home}, later in SRCS)")
    for line in upward:
        print("layers:", line)
    print(f"layers: {len(srcs)} files, {len(upward)} calls going up")
    return 1 if upward else 0


if __name__ == "__main__":
    sys.exit(main())
