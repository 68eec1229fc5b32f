#!/usr/bin/env python3
"""prof-flamegraph.py - turns a cmalloc heap profile into a flame graph SVG.

    scripts/prof-flamegraph.py PROFILE [-o OUT.svg] [--alloc] [--title TEXT]

PROFILE is what cmalloc_prof_dump / CMALLOC_PROF_DUMP / CMALLOC_PROF_SIGNAL write: pprof's legacy
heap-profile text (one line per stack: in-use count and bytes, allocated count and bytes, return
addresses) followed by MAPPED_LIBRARIES: and the process's /proc/self/maps. Each address is
placed in its mapping, turned into an address in its ELF file (through the file's program
headers, read with readelf) and named with addr2line (binutils), in one batch per file.

The picture: one box per function on a stack, its width the live bytes (or, with --alloc, the
bytes allocated so far) under it, callers below callees, the allocating function on top.
Hovering a box shows its name, bytes and share. Unnamed frames show as file+offset.
(google-pprof --svg PROGRAM PROFILE draws pprof's call graph instead, through graphviz.)
"""
import argparse
import collections
import html
import os
import re
import subprocess
import sys

RECORD = re.compile(r"^\s*(\d+):\s+(\d+)\s+\[\s*(\d+):\s+(\d+)\]\s+@\s*(.*)$")


def read_profile(path, alloc):
    """Returns ([(value, [addresses, innermost first])], [(start, end, offset, path)])."""
    stacks, maps, in_maps = [], [], False
    with open(path) as f:
        for number, line in enumerate(f):
            if in_maps:
                fields = line.split()
                if len(fields) >= 6 and "x" in fields[1]:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    maps.append((start, end, int(fields[2], 16), fields[5]))
                continue
            if line.startswith("MAPPED_LIBRARIES:"):
                in_maps = True
                continue
            match = RECORD.match(line)
            if match is None or number == 0:  # the first line is the totals
                continue
            value = int(match.group(4) if alloc else match.group(2))
            addresses = [int(a, 16) for a in match.group(5).split()]
            if value > 0:
                stacks.append((value, addresses))
    return stacks, maps


def segments(path):
    """The file's loadable segments: [(file offset, virtual address, size in file)]."""
    try:
        text = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["LOAD"]:
            found.append((int(fields[1], 16), int(fields[2], 16), int(fields[4], 16)))
    return found


def symbolise(addresses, maps):
    """Maps each address to its functions, innermost (inlined) first, or [file+offset]."""
    names, per_file = {}, collections.defaultdict(list)
    for address in addresses:
        for start, end, offset, path in maps:
            if start <= address < end:
                # a return address: the call is the byte before it
                per_file[path].append((address, address - 1 - start + offset))
                break
        else:
            names[address] = [hex(address)]
    for path, items in per_file.items():
        loads = segments(path) if os.path.exists(path) else []
        elf = []
        for address, file_offset in items:
            vaddr = file_offset
            for seg_offset, seg_vaddr, seg_size in loads:
                if seg_offset <= file_offset < seg_offset + seg_size:
                    vaddr = file_offset - seg_offset + seg_vaddr
            elf.append(vaddr)
        found = []
        if loads:
            # -i: the functions inlined at an address too, innermost first; each address is
            # followed by 0, which names nothing ("??"), to mark where its answer ends
            query = [a for v in elf for a in (hex(v), "0x0")]
            try:
                out = subprocess.run(["addr2line", "-f", "-i", "-C", "-e", path] + query,
                                     capture_output=True, text=True).stdout.splitlines()
            except OSError:
                out = []
            chain = []
            for function in out[0::2]:
                if function == "??":
                    found.append(chain)
                    chain = []
                else:
                    chain.append(function)
        for i, (address, file_offset) in enumerate(items):
            chain = found[i] if i < len(found) and found[i] else None
            names[address] = chain or ["%s+%#x" % (os.path.basename(path), file_offset)]
    return names


def fold(stacks, names):
    """Sums values by stack of names, outermost caller first."""
    folded = collections.Counter()
    for value, addresses in stacks:
        frames = [f for a in reversed(addresses) for f in reversed(names[a])]
        folded[tuple(frames)] += value
    return folded


def colour(name):
    h = sum(ord(c) * (i + 1) for i, c in enumerate(name))
    return "rgb(%d,%d,%d)" % (205 + h % 50, 80 + (h // 7) % 130, 40 + (h // 13) % 50)


def svg(folded, title, unit):
    """A flame graph: a tree of boxes, each as wide as the bytes under it."""
    tree = {"children": collections.OrderedDict(), "value": 0}
    for frames, value in sorted(folded.items()):
        node = tree
        node["value"] += value
        for frame in frames:
            node = node["children"].setdefault(frame, {"children": collections.OrderedDict(), "value": 0})
            node["value"] += value
    total = tree["value"] or 1
    depth = max((len(f) for f in folded), default=0)
    width, row, top = 1200, 18, 40
    height = top + (depth + 1) * row + 10
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="monospace" '
           'font-size="11">' % (width, height),
           '<rect width="100%" height="100%" fill="#fdfdf5"/>',
           '<text x="%d" y="20" font-size="15" text-anchor="middle">%s</text>'
           % (width // 2, html.escape(title)),
           '<text x="10" y="%d" fill="#555">total %s %s, width = %s</text>' % (top - 6, f"{total:,}", unit, unit)]

    def draw(node, name, x, level):
        w = node["value"] / total * (width - 20)
        if w < 0.5:
            return
        y = height - 10 - (level + 1) * row
        label = html.escape(name)
        tip = "%s: %s %s (%.1f%%)" % (label, f"{node['value']:,}", unit, 100.0 * node["value"] / total)
        out.append('<g><title>%s</title><rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" '
                   'rx="2"/>' % (tip, x, y, w, row - 1, colour(name)))
        chars = int(w / 7)
        if chars >= 3:
            text = label if len(name) <= chars else html.escape(name[: chars - 2]) + ".."
            out.append('<text x="%.1f" y="%d">%s</text>' % (x + 3, y + row - 5, text))
        out.append("</g>")
        for child_name, child in node["children"].items():
            draw(child, child_name, x, level + 1)
            x += child["value"] / total * (width - 20)

    x = 10.0
    for name, child in tree["children"].items():
        draw(child, name, x, 0)
        x += child["value"] / total * (width - 20)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile")
    parser.add_argument("-o", "--output", default="-", help="SVG file (default: standard output)")
    parser.add_argument("--alloc", action="store_true", help="bytes allocated so far, not live bytes")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    stacks, maps = read_profile(args.profile, args.alloc)
    if not stacks:
        sys.exit("prof-flamegraph: no samples in %s" % args.profile)
    names = symbolise({a for _, s in stacks for a in s}, maps)
    title = args.title or "cmalloc heap profile: %s (%s)" % (os.path.basename(args.profile),
                                                             "allocated" if args.alloc else "live")
    picture = svg(fold(stacks, names), title, "bytes")
    if args.output == "-":
        sys.stdout.write(picture)
    else:
        with open(args.output, "w") as f:
            f.write(picture)


if __name__ == "__main__":
    main()
