#!/usr/bin/env python3
"""Where one published event's first microseconds go, seen by the kernel.

Records a few seconds of the scheduler's and the socket system calls'
tracepoints with `perf` (root, or perf_event_paranoid <= -1), while a load
tool publishes over HTTP to a server that writes SSE frames to the same
load tool's subscribers (the floor scenario, say). Then, for each publish,
prints when the server read the request, which of its threads were woken
and ran before the first frame was written, when that frame's writer and
the load tool's reader were woken and when they got a CPU, and when the
first frame was read: medians and 90th percentiles over the recorded
events, in ms after the publish request was written. Then, for the time
the load tool's reader spent woken but off a CPU, who had the CPUs: the
server's threads, the load tool's other threads, Postgres, others, or
nobody (an idle CPU still waking up).

    trace_event.py --server-pid 1234 --client-pid 5678 [--seconds 2]
    trace_event.py --server-pid 1234 --client-pid 5678 --from-trace kept.txt

`--server-pid` takes a comma-separated list (nginx's worker processes).
Tracing every socket call costs CPU: figures under it are slower than
without, so compare two servers traced the same way, not a traced server
with an untraced run.
"""

import argparse
import bisect
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile

WRITES = ("sendto", "writev", "write")
READS = ("recvfrom", "read", "readv")
# Publish requests closer together than this are one publish.
PUBLISH_GAP_S = 0.002
# How long after a publish its first frame is looked for.
WINDOW_S = 0.02
# A publish this soon after the server's last frame is left out: the
# frames after it may still be the last event's.
QUIET_S = 0.001

LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


def record(seconds, data):
    """Runs perf system-wide for `seconds`, leaving out perf's own calls
    (tracing them would fill a CPU with perf reading its own buffers)."""
    events = ["sched:sched_switch", "sched:sched_wakeup"]
    syscalls = [f"syscalls:sys_enter_{c}" for c in WRITES + READS]
    syscalls += [f"syscalls:sys_exit_{c}" for c in READS]
    script = "f=\"common_pid != $$\"; exec perf record -q -a -m 1024 -o \"$0\""
    for event in events:
        script += f" -e {event}"
    for event in syscalls:
        script += f" -e {event} --filter \"$f\""
    script += f" -- sleep {seconds}"
    subprocess.run(["bash", "-c", script, data], check=True)
    out = subprocess.run(
        ["perf", "script", "--ns", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
        check=True,
        capture_output=True,
        text=True,
        errors="replace",
    )
    return out.stdout.splitlines()


def hex_field(rest, name):
    match = re.search(name + r": (0x[0-9a-f]+)", rest)
    return int(match.group(1), 16) if match else None


class Call:
    """A system call, a wake-up or a switch, in time order."""

    __slots__ = ("t", "kind", "pid", "tid", "fd", "size", "cpu")

    def __init__(self, t, kind, pid, tid, fd=None, size=None, cpu=None):
        self.t, self.kind, self.pid, self.tid, self.fd, self.size = t, kind, pid, tid, fd, size
        self.cpu = cpu


def parse(lines):
    calls, names, process_of, entered = [], {}, {}, {}
    for line in lines:
        match = LINE.match(line)
        if not match:
            continue
        comm, pid, tid, cpu, t, event, rest = match.groups()
        pid, tid, t, cpu = int(pid), int(tid), float(t), int(cpu)
        names[tid], process_of[tid] = comm, pid
        if event.startswith("syscalls:sys_enter_"):
            call = event[len("syscalls:sys_enter_"):]
            fd = hex_field(rest, "fd")
            entered[tid] = fd
            if call in WRITES:
                size = hex_field(rest, "len") or hex_field(rest, "count") or hex_field(rest, "vlen")
                calls.append(Call(t, "write", pid, tid, fd, size))
        elif event.startswith("syscalls:sys_exit_"):
            fd = entered.pop(tid, None)
            value = re.search(r"(0x[0-9a-f]+)\s*$", rest)
            if value:
                size = int(value.group(1), 16)
                if size < 1 << 63:
                    calls.append(Call(t, "read", pid, tid, fd, size))
        elif event == "sched:sched_switch":
            next_pid = re.search(r"next_pid=(\d+)", rest)
            next_comm = re.search(r"next_comm=(.+?) next_pid=", rest)
            next_tid = int(next_pid.group(1))
            if next_comm and next_tid not in names:
                names[next_tid] = next_comm.group(1)
            calls.append(Call(t, "on_cpu", None, next_tid, cpu=cpu))
        elif event == "sched:sched_wakeup":
            woken = re.search(r" pid=(\d+)", rest)
            calls.append(Call(t, "woken", None, int(woken.group(1))))
    calls.sort(key=lambda c: c.t)
    for call in calls:
        if call.pid is None:
            call.pid = process_of.get(call.tid)
    return calls, names


def last_before(window, kind, tid, t):
    found = [c.t for c in window if c.kind == kind and c.tid == tid and c.t <= t]
    return found[-1] if found else None


def holders(switches, names, servers, client, start, end):
    """CPU time in [start, end] by who held each CPU: from `switches`, each
    CPU's switch times and its (time, tid, pid) switches, in time order."""
    held = collections.Counter()
    for times, on_cpu in switches.values():
        i = max(bisect.bisect_right(times, start) - 1, 0)
        while i < len(on_cpu) and on_cpu[i][0] < end:
            t, tid, pid = on_cpu[i]
            until = on_cpu[i + 1][0] if i + 1 < len(on_cpu) else end
            spent = min(until, end) - max(t, start)
            if spent > 0:
                if tid == 0:
                    who = "nobody (idle)"
                elif pid in servers:
                    who = "the server"
                elif pid == client:
                    who = "the load tool's other threads"
                elif names.get(tid, "").startswith("postgres"):
                    who = "Postgres"
                else:
                    who = "others"
                held[who] += spent
            i += 1
    return held


def timeline(calls, names, servers, client):
    publishes = [c for c in calls if c.kind == "write" and c.pid == client]
    publishing_fds = {c.fd for c in publishes}
    starts = []
    for call in publishes:
        if not starts or call.t - starts[-1] > PUBLISH_GAP_S:
            starts.append(call.t)
    frame_sizes = collections.Counter(
        c.size for c in calls if c.kind == "write" and c.pid in servers
    )
    if not frame_sizes or not starts:
        sys.exit("no publish or no frame in the trace: are the pids right, and was a load running?")
    frame_size = frame_sizes.most_common(1)[0][0]
    times = [c.t for c in calls]
    frame_times = [c.t for c in calls if c.kind == "write" and c.pid in servers and c.size == frame_size]
    rows = collections.defaultdict(list)
    waits = collections.defaultdict(list)
    switches = collections.defaultdict(lambda: ([], []))
    for c in calls:
        if c.kind == "on_cpu":
            switches[c.cpu][0].append(c.t)
            switches[c.cpu][1].append((c.t, c.tid, c.pid))
    skipped = 0
    # The first and last few may be cut by the recording's edges.
    for t0 in starts[3:-3]:
        before = bisect.bisect_left(frame_times, t0)
        if before and t0 - frame_times[before - 1] < QUIET_S:
            skipped += 1
            continue
        window = calls[bisect.bisect_left(times, t0):bisect.bisect_left(times, t0 + WINDOW_S)]

        def first(test):
            return next((c for c in window if test(c)), None)

        request = first(lambda c: c.kind == "read" and c.pid in servers and c.size > 0)
        frame = first(lambda c: c.kind == "write" and c.pid in servers and c.size == frame_size)
        if not (request and frame):
            continue
        received = first(
            lambda c: c.kind == "read" and c.pid == client and c.size > 0
            and c.fd not in publishing_fds and c.t >= frame.t
        )
        if not received:
            continue
        rows["server reads the request"].append(request.t - t0)
        rows["first frame written"].append(frame.t - t0)
        rows["first frame read by the client"].append(received.t - t0)
        for label, tid, until in (
            ("frame's writer", frame.tid, frame.t),
            ("client's reader", received.tid, received.t),
        ):
            woken = last_before(window, "woken", tid, until)
            running = last_before(window, "on_cpu", tid, until)
            if woken is not None:
                rows[f"{label} woken"].append(woken - t0)
            if running is not None:
                rows[f"{label} gets a CPU"].append(running - t0)
            if label == "client's reader" and woken is not None and running is not None and running > woken:
                held = holders(switches, names, servers, client, woken, running)
                for who in ("the server", "the load tool's other threads", "Postgres", "others", "nobody (idle)"):
                    waits[who].append(held.get(who, 0.0))
        seen, woken_at = set(), {}
        for call in window:
            if call.t > frame.t:
                break
            if call.kind == "woken" and call.pid in servers:
                woken_at.setdefault(call.tid, call.t)
            if call.kind == "on_cpu" and call.pid in servers and call.tid not in seen:
                seen.add(call.tid)
                name = f"server thread {names.get(call.tid, '?')} ({call.tid})"
                rows[f"{name} gets a CPU"].append(call.t - t0)
                # The wake-up that put it on a CPU, when it happened in the
                # window: how long the thread then waited for the CPU.
                if call.tid in woken_at:
                    rows[f"{name} woken"].append(woken_at[call.tid] - t0)
        rows["#frames written before the client's first read"].append(
            sum(1 for c in window if c.kind == "write" and c.pid in servers
                and c.size == frame_size and c.t < received.t)
        )
    return rows, waits, len(starts), skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-pid", required=True)
    parser.add_argument("--client-pid", required=True, type=int)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--keep", help="write perf's decoded trace to this file too")
    parser.add_argument("--from-trace", help="read a trace written by --keep instead of recording")
    args = parser.parse_args()
    servers = {int(p) for p in args.server_pid.split(",")}
    if args.from_trace:
        with open(args.from_trace) as kept:
            lines = kept.read().splitlines()
    else:
        with tempfile.TemporaryDirectory() as work:
            lines = record(args.seconds, os.path.join(work, "perf.data"))
    if args.keep:
        with open(args.keep, "w") as kept:
            kept.write("\n".join(lines))
    calls, names = parse(lines)
    rows, waits, publishes, skipped = timeline(calls, names, servers, args.client_pid)
    print(
        f"{publishes} publishes, {skipped} left out (the server was still writing the one before);"
        " ms after the publish request was written (p50 / p90):"
    )
    for label, values in sorted(rows.items(), key=lambda kv: statistics.median(kv[1])):
        ordered = sorted(values)
        p90 = ordered[int(len(ordered) * 0.9)]
        if label.startswith("#"):
            print(f"  {label[1:]:58} {statistics.median(values):8.0f} / {p90:.0f}  (n={len(values)})")
        else:
            print(f"  {label:58} {statistics.median(values) * 1e3:8.3f} / {p90 * 1e3:.3f}  (n={len(values)})")
    if waits:
        print("while the client's reader was woken but off a CPU, CPU time (both CPUs) held by, ms (p50 / p90):")
        for who, values in waits.items():
            ordered = sorted(values)
            p90 = ordered[int(len(ordered) * 0.9)]
            print(f"  {who:58} {statistics.median(values) * 1e3:8.3f} / {p90 * 1e3:.3f}  (n={len(values)})")


if __name__ == "__main__":
    main()
