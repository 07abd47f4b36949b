#!/usr/bin/env python3
"""pprof-parts: where a relayed event's microseconds go, from CPU profiles.

usage: bench/pprof-parts.py NAME=BINARY:PROFILE:EVENTS [NAME=BINARY:PROFILE:EVENTS ...]

Each PROFILE is a relay CPU profile over a drain of EVENTS events (the
`profile` part of `make bench` writes relay-d100prof.cpu.pb.gz and, with a
base relay, relay-d100profbase.cpu.pb.gz into its run directory). Every
sample of `go tool pprof -traces` is counted once, under the first part in
PARTS whose pattern matches a frame of its stack; the table gives each part
in microseconds per event (sampled seconds / EVENTS), one column per
profile, as markdown.
"""
import re
import subprocess
import sys

# (part, what it is, pattern). Order matters: the first match wins, so the
# runtime's own work comes first, then the paths from the most specific
# (a frame only that work has) to the most general.
PARTS = [
    ("GC", "mark workers, assists, sweeping, the scavenger returning memory",
     r"^runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge|gcStart|gcMarkDone|gcMarkTermination|wbBufFlush|sweepone)"),
    ("goroutine switches", "parking and waking goroutines and threads, idle polling of the network",
     r"^runtime\.(schedule|findRunnable|park_m|gopark|goready|ready|wakep|startm|stopm|notewakeup|notesleep|mcall|netpoll)$"),
    ("metrics scrapes", "the bench's /metrics reads (every 200 ms)", r"^net/http\.\(\*conn\)\.serve"),
    ("replication receive", "socket reads and pgproto3 framing of the walsender's CopyData",
     r"pgconn\.\(\*PgConn\)\.ReceiveMessage"),
    ("decode", "pgoutput Insert -> decoder.Event: values cut from shared blocks, headers JSON scanned",
     r"/outbox-relay/decoder\."),
    ("records: headers, key, topic", "the relay's headers and the row's, the key, the route",
     r"/outbox-relay/relay\.(headersIn|recordTo|Route|\(\*Router\)|\(\*Pipeline\)\.route)|/outbox-relay/sink\.(Route|\(\*Router\))"),
    ("acks and checkpoint", "per ack: metrics, the order watch, the tracker (after the broker's response)",
     r"/outbox-relay/sink\.\(\*Producer\)\.complete|/outbox-relay/relay\.\(\*delivery\)\.done|/outbox-relay/checkpoint\."),
    ("Kafka request encoding", "sarama's encoder: each request measured, then written, into a fresh buffer",
     r"IBM/sarama\.encode$|IBM/sarama\.\(\*request\)\.encode"),
    ("Kafka network", "writing produce requests, reading and decoding responses",
     r"IBM/sarama\.\(\*Broker\)\.(write|responseReceiver|readFull)|IBM/sarama\.versionedDecode"),
    ("producer queue and sender", "direct: per-partition queues, batches, a sender per broker; sarama: the AsyncProducer's goroutines",
     r"/outbox-relay/sink\.|IBM/sarama\.\(\*(asyncProducer|topicProducer|partitionProducer|brokerProducer|produceSet)\)|IBM/sarama\.withRecover"),
    ("pipeline and replication loop", "handleTxn's deliveries, the loop's clock reads and lock, status updates",
     r"/outbox-relay/(relay|replication)\."),
    ("other", "runtime and libraries outside the paths above", r"."),
]

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def samples(binary, profile):
    """Yields (seconds, frames) per stack of the profile."""
    out = subprocess.run(["go", "tool", "pprof", "-traces", binary, profile],
                         capture_output=True, text=True, check=True).stdout
    for block in out.split("-----------+-------------------------------------------------------")[1:]:
        lines = [l for l in block.splitlines() if l.strip()]
        if not lines:
            continue
        m = re.match(r"\s*([\d.]+)(ns|us|µs|ms|s)\s+(.*)", lines[0])
        if not m:
            continue
        frames = [m.group(3).strip()] + [l.strip() for l in lines[1:]]
        frames = [re.sub(r"\s*\(inline\)$", "", f) for f in frames]
        yield float(m.group(1)) * UNITS[m.group(2)], frames


def parts_of(binary, profile):
    got = {p[0]: 0.0 for p in PARTS}
    compiled = [(name, re.compile(pat)) for name, _, pat in PARTS]
    for secs, frames in samples(binary, profile):
        for name, pat in compiled:
            if any(pat.search(f) for f in frames):
                got[name] += secs
                break
    return got


def main(args):
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    cols = []
    for a in args:
        name, _, spec = a.partition("=")
        try:
            binary, profile, events = spec.rsplit(":", 2)
            events = int(events)
        except ValueError:
            print(f"{a}: want NAME=BINARY:PROFILE:EVENTS", file=sys.stderr)
            return 2
        cols.append((name, parts_of(binary, profile), events))
    print("| part | " + " | ".join(f"{n} us/event" for n, _, _ in cols) + " | what it is |")
    print("|---|" + "---:|" * len(cols) + "---|")
    for name, what, _ in PARTS:
        print(f"| {name} | " + " | ".join(f"{got[name] / ev * 1e6:.2f}" for _, got, ev in cols) + f" | {what} |")
    print("| **total sampled** | " + " | ".join(f"**{sum(got.values()) / ev * 1e6:.2f}**" for _, got, ev in cols) + " | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
