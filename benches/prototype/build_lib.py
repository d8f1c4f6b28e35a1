#!/usr/bin/env python3
"""Builds a Functions library of the limiter's Lua at a git ref (or a work tree).
usage: build_lib.py NAME REPO REF|- OUT
The lua/ files in the order of that version's src/limiter/script.rs
(library_body!), then redis.register_function('NAME_l', limiter_call)."""
import re, subprocess, sys
name, repo, ref, out = sys.argv[1:]
def read(path):
    if ref == '-':
        return open(f'{repo}/{path}').read()
    return subprocess.run(['git', '-C', repo, 'show', f'{ref}:{path}'], check=True,
                          capture_output=True, text=True).stdout
script = read('src/limiter/script.rs')
body = script[script.index('macro_rules! library_body'):]
body = body[:body.index('};')]
files = re.findall(r'include_str!\("\.\./\.\./(lua/[a-z_]+\.lua)"\)', body)
code = f'#!lua name={name}\n' + ''.join(read(f) for f in files)
code += f"\nredis.register_function('{name}_l', limiter_call)\n"
open(out, 'w').write(code)
print(name, ref, files)
