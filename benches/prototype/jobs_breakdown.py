#!/usr/bin/env python3
"""Where the Redis CPU of one request in a coalesced call goes (issue 10).

Loads five variants of the limiter library into a private redis-server, each
cut short at one stage of lua/jobs.lua's per-request path, and drives each
with redis-benchmark: FCALL of a 'jobs' call carrying NREQ sellers' requests
(one gcra rule each, never refusing, random sellers out of 10,000). Redis'
own CPU per call (INFO commandstats) divided by NREQ is the CPU per request;
the difference between two stages is what that stage costs. Variants run in
turn, ROUNDS times, and the median is printed (the machine is noisy).

    python3 benches/prototype/jobs_breakdown.py          # NREQ=64 ROUNDS=3
    NREQ=128 N=5000 python3 benches/prototype/jobs_breakdown.py

Needs redis-server, redis-cli and redis-benchmark (Debian's redis-server
and redis-tools). The cuts are text patches of the current Lua: when the
Lua changes shape, a patch stops matching and the script says which.
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
ORDER = ['common', 'fixed_window', 'sliding_window_log', 'sliding_window_counter',
         'token_bucket', 'leaky_bucket', 'burst_fill', 'gcra', 'jobs', 'limiter', 'block']
NREQ = int(os.environ.get('NREQ', '64'))
N = int(os.environ.get('N', '3000'))
ROUNDS = int(os.environ.get('ROUNDS', '3'))


def lua(name):
    with open(os.path.join(ROOT, 'lua', name + '.lua')) as f:
        return f.read()


def patched(text, old, new, what):
    if old not in text:
        sys.exit(f'jobs_breakdown: lua/jobs.lua changed, the cut "{what}" no longer applies')
    return text.replace(old, new, 1)


JOBS = lua('jobs')
CALL = '    jobs_request(out, now, charge, r.id, blocked_until, r.rules, r.costs)\n'
LOADS = '  local states, avail = {}, {}\n'
TAKE = '  if charge then\n    for i = 1, #rules do'
# Each stage: (name, what it adds, jobs.lua as cut there).
STAGES = [
    ('parse', 'the call itself: arguments, KEYS/ARGV, reading every request, the block GET',
     patched(JOBS, CALL, '    out[#out + 1] = 1\n', 'parse')),
    ('read', "the rule state's HMGET",
     patched(JOBS, LOADS, '  for i = 1, #rules do rules[i].algo.load(rules[i].key, rules[i], now) end\n'
             '  out[#out + 1] = 1\n  if true then return end\n' + LOADS, 'read')),
    ('decide', 'the decision: availability, prefix, summary, the reply row',
     patched(JOBS, TAKE, '  if false then\n    for i = 1, #rules do', 'decide')),
    ('write, no PEXPIRE', 'HSET of the new state (TAT and remainder as exact integers)',
     patched(JOBS, 'local function jobs_request(',
             "ALGO.gcra.take = function(key, st, r, now, n, id)\n"
             "  local debt = st.debt + n * r.period\n"
             "  local whole = fdiv(debt, r.limit)\n"
             "  redis.call('HSET', key, 'tat', I(now + whole), 'f', I(debt - whole * r.limit))\n"
             "end\nlocal function jobs_request(", 'write')),
    ('full', "PEXPIRE: the key's TTL (useful life plus 1 s)", JOBS),
]


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def main():
    port = free_port()
    work = tempfile.mkdtemp(prefix='jobs-breakdown-')
    server = subprocess.Popen(['redis-server', '--port', str(port), '--bind', '127.0.0.1',
                               '--save', '', '--appendonly', 'no', '--dir', work],
                              stdout=subprocess.DEVNULL)
    try:
        cli = lambda *a, inp=None: subprocess.run(
            ['redis-cli', '-p', str(port)] + list(a), input=inp, capture_output=True, text=True).stdout
        for _ in range(50):
            if cli('PING').strip() == 'PONG':
                break
            time.sleep(0.1)
        names = []
        for i, (stage, _, jobs) in enumerate(STAGES):
            body = ''.join(jobs if n == 'jobs' else lua(n) for n in ORDER)
            lib = f"#!lua name=v{i}\n{body}\nredis.register_function('v{i}', limiter_call)\n"
            out = subprocess.run(['redis-cli', '-p', str(port), '-x', 'FUNCTION', 'LOAD'],
                                 input=lib, capture_output=True, text=True).stdout.strip()
            if out != f'v{i}':
                sys.exit(f'jobs_breakdown: FUNCTION LOAD of stage {stage}: {out}')
            names.append(f'v{i}')
        keys, args = [], []
        for i in range(NREQ):
            keys += ['bd:{s__rand_int__}:block', 'bd:{s__rand_int__}:gcra']
            args += [f'id{i}', '1', '1', 'gcra', '50000000', '60000000', '50000000']
        per_req = {n: [] for n in names}
        print(f'# jobs_breakdown: {NREQ} requests per call, {N} calls per run, {ROUNDS} rounds, '
              f'redis-server on 127.0.0.1:{port}', flush=True)
        for r in range(ROUNDS):
            for n in names:
                cli('CONFIG', 'RESETSTAT')
                subprocess.run(['redis-benchmark', '-p', str(port), '-c', '8', '-n', str(N),
                                '-r', '10000', '-q', 'FCALL', n, str(2 * NREQ)] + keys
                               + ['jobs', '', str(NREQ)] + args, capture_output=True, text=True)
                m = re.search(r'cmdstat_fcall:calls=(\d+),usec=(\d+)', cli('INFO', 'commandstats'))
                calls, usec = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
                per_req[n].append(usec / max(calls, 1) / NREQ)
            print(f'round {r + 1} of {ROUNDS} done', file=sys.stderr, flush=True)
        print('\n| stage | Redis µs per request (median) | this stage adds | what it adds |')
        print('|---|---:|---:|---|')
        prev = 0.0
        for (stage, what, _), n in zip(STAGES, names):
            v = sorted(per_req[n])[len(per_req[n]) // 2]
            print(f'| {stage} | {v:.2f} | {v - prev:+.2f} | {what} |')
            prev = v
    finally:
        server.terminate()
        server.wait()


if __name__ == '__main__':
    main()
