"""redis-py's Lock (redis.lock.Lock), driven by the interop tests over
stdin/stdout, one command a line:

    try ID NAME TTL_MS     prints "ID got" or "ID busy"
    lock ID NAME TTL_MS    prints "ID waiting", then "ID locked" (polls every 50 ms)
    release ID             prints "ID released"
    exit

Usage: python3 redispy_lock.py REDIS_URL
"""

import sys
import threading

import redis

_out = threading.Lock()


def say(s):
    with _out:
        print(s, flush=True)


def main():
    r = redis.Redis.from_url(sys.argv[1])
    held = {}
    say("ready")
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        if f[0] == "exit":
            break
        cmd, lid = f[0], f[1]
        if cmd == "try":
            lock = r.lock(f[2], timeout=int(f[3]) / 1000.0, thread_local=False)
            if lock.acquire(blocking=False):
                held[lid] = lock
                say(lid + " got")
            else:
                say(lid + " busy")
        elif cmd == "lock":
            lock = r.lock(f[2], timeout=int(f[3]) / 1000.0, sleep=0.05, thread_local=False)

            def run(lid=lid, lock=lock):
                say(lid + " waiting")
                lock.acquire(blocking=True)
                held[lid] = lock
                say(lid + " locked")

            threading.Thread(target=run, daemon=True).start()
        elif cmd == "release":
            held.pop(lid).release()
            say(lid + " released")
        else:
            say("error unknown command " + cmd)


if __name__ == "__main__":
    main()
