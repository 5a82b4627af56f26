#!/usr/bin/env python3
"""Idle memory per stream, read from outside the load tool.

Starts a release relay on a fresh schema, opens N `GET /v1/events` streams
on one scope from plain asyncio sockets in this process, waits for every
`ready` frame and prints (RSS growth) / N at the given delays as JSON. How
many handshakes are in flight, browser-like headers and a `grants` claim
each move the figure, so they are options:

    python3 bench/idle_probe.py --relay-bin target/release/eventrelay \\
        --streams 10000 --concurrency 10000 --browser-headers --grants-bytes 300
"""
import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request

SECRET = b"bench-secret-that-is-long-enough-for-hs256-signing"

# What a browser's EventSource sends besides the token (Chromium, same-site).
BROWSER_HEADERS = (
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36\r\n"
    "Accept-Language: en-US,en;q=0.9\r\n"
    "Accept-Encoding: gzip, deflate, br, zstd\r\n"
    "Cache-Control: no-cache\r\n"
    "Connection: keep-alive\r\n"
    "Origin: http://127.0.0.1:3000\r\n"
    "Referer: http://127.0.0.1:3000/dashboard\r\n"
    "Sec-Fetch-Dest: empty\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Site: same-site\r\n"
    "Cookie: session=" + "c" * 400 + "\r\n"
)


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def token(subscriber, scope, grants_bytes):
    now = int(time.time())
    claims = {"iat": now, "exp": now + 3600, "sub": subscriber, "scope": scope}
    if grants_bytes:
        grants, index = {}, 0
        while len(json.dumps(grants)) < grants_bytes:
            grants[f"resource-{index:04d}"] = ["read", "write"]
            index += 1
        claims["grants"] = grants
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = b64(hmac.new(SECRET, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + signature).decode()


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def request(index, args):
    text = (
        f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\n"
        f"Accept: text/event-stream\r\n"
        f"Authorization: Bearer {token(f's{index}', 'probe', args.grants_bytes)}\r\n"
    )
    if args.browser_headers:
        text += BROWSER_HEADERS
    return (text + "\r\n").encode()


async def stream(index, args, head, ready, gate):
    async with gate:
        reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
        writer.write(head)
        seen = b""
        while b"event: ready" not in seen:
            chunk = await reader.read(4096)
            if not chunk:
                raise RuntimeError(f"closed before ready: {seen[:200]!r}")
            seen += chunk
    ready.append(writer)
    while await reader.read(4096):
        pass


async def probe(args, pid):
    # Every request is made before the clock starts: a client busy minting
    # tokens would send its heads late (past http.header_timeout_secs).
    heads = [request(i, args) for i in range(args.streams)]
    before = rss(pid)
    ready = []
    gate = asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    tasks = [asyncio.create_task(stream(i, args, heads[i], ready, gate))
             for i in range(args.streams)]
    while len(ready) < args.streams:
        failed = [t for t in tasks if t.done() and t.exception()]
        if failed:
            raise failed[0].exception()
        await asyncio.sleep(0.01)
    all_ready = time.monotonic()
    figures = {"streams": args.streams, "connect_s": round(all_ready - started, 2),
               "rss_before_mib": round(before / 2**20, 1)}
    for delay in args.read_after:
        await asyncio.sleep(max(0.0, all_ready + delay - time.monotonic()))
        figures[f"kib_per_stream_after_{delay:g}s"] = round(
            (rss(pid) - before) / args.streams / 1024, 2)
    for writer in ready:
        writer.close()
    for task in tasks:
        task.cancel()
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--relay-bin", required=True)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--port", type=int, default=18700)
    parser.add_argument("--streams", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=200,
                        help="handshakes in flight at once (the load tool keeps 200)")
    parser.add_argument("--browser-headers", action="store_true")
    parser.add_argument("--grants-bytes", type=int, default=0)
    parser.add_argument("--read-after", type=float, nargs="+", default=[5.0, 20.0])
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    schema = f"probe_{os.getpid()}"
    work = tempfile.mkdtemp(prefix="eventrelay-probe.")
    config = os.path.join(work, "relay.toml")
    with open(config, "w") as file:
        file.write(f"""\
database = {{ url = "{args.database_url}", schema = "{schema}", channel = "{schema}" }}
http = {{ bind = "127.0.0.1:{args.port}", workers = 2, inspector = false }}
sse = {{ max_age_secs = 3600 }}
hub = {{ arbiters = 2 }}
auth = {{ mode = "jwt", algorithm = "HS256", secret = "{SECRET.decode()}" }}
log = {{ level = "warn" }}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTRELAY_")}
    env.pop("DATABASE_URL", None)
    log = open(os.path.join(work, "relay.log"), "w")
    subprocess.run([args.relay_bin, "migrate", "--config", config], env=env,
                   stdout=log, stderr=log, check=True)
    relay = subprocess.Popen([args.relay_bin, "serve", "--config", config], env=env,
                             stdout=log, stderr=log)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1)
        print(json.dumps(asyncio.run(probe(args, relay.pid))), flush=True)
    finally:
        relay.terminate()
        relay.wait()
        subprocess.run(["psql", args.database_url, "-qc", f"DROP SCHEMA IF EXISTS {schema} CASCADE"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
