#!/usr/bin/env python3
"""Turns ndm-memviz's page (page.html) into C: page_head and page_tail, the
page before and after the snapshot's data, which goes where the page holds
@NDM_DATA@ (once). Usage: embed.py page.html page.h"""
import sys

MARK = '@NDM_DATA@'


def literal(text):
    """C string literals, one per line of text; only printable ASCII stays as
    it is ('?' escaped against trigraphs)."""
    out = []
    for line in text.splitlines(keepends=True):
        s = ''
        for ch in line:
            c = ord(ch)
            if ch in '\\"?':
                s += '\\' + ch
            elif ch == '\n':
                s += '\\n'
            elif 0x20 <= c < 0x7f:
                s += ch
            else:
                s += ''.join('\\%03o' % b for b in ch.encode('utf-8'))
        out.append('    "' + s + '"')
    return '\n'.join(out) if out else '    ""'


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: embed.py page.html page.h')
    with open(sys.argv[1], encoding='utf-8', newline='') as f:
        page = f.read()
    if page.count(MARK) != 1:
        sys.exit('%s: %s must appear exactly once' % (sys.argv[1], MARK))
    head, tail = page.split(MARK)
    with open(sys.argv[2], 'w', encoding='ascii', newline='\n') as f:
        f.write('/* Generated from page.html by embed.py: do not edit. */\n')
        f.write('static const char page_head[] =\n%s;\n' % literal(head))
        f.write('static const char page_tail[] =\n%s;\n' % literal(tail))


if __name__ == '__main__':
    main()
