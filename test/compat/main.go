// Command outbox-compat is the Go half of `make compat` (test/run-compat.sh) and `make bench-peer`: it prepares
// Debezium's recommended outbox table with one slot and publication per contender, writes a deterministic
// hostile backlog, manages the event topics, waits for a contender's output (timing it and the CPU and peak RSS
// of its process), dumps every record a real consumer reads, checks a dump against the backlog and compares two
// dumps record by record.
//
//	outbox-compat prepare  -pg URL -table public.outbox -slot NAME:PUBLICATION [-slot ...]
//	outbox-compat write    -pg URL -table public.outbox -events 20000 -aggregates 300 -manifest FILE [-seed 1]
//	outbox-compat topics   -brokers B -manifest FILE -partitions 4 (-create | -delete | -recreate)
//	outbox-compat wait     -brokers B -prefix outbox.event. -records N [-pid PID] [-timeout 10m] [-out FILE]
//	outbox-compat dump     -brokers B -prefix outbox. -out FILE
//	outbox-compat verify   -manifest FILE -dump FILE [-name NAME]
//	outbox-compat compare  -a FILE -b FILE [-a-name debezium] [-b-name relay] [-allow DOC]
//	outbox-compat report   -run DIR -repeats N -first debezium,relay,... [-events N ...] (make bench-peer's
//	                       peer.md and peer.png from RUN/{debezium,relay}-<repeat>-wait.json)
//
// Every subcommand exits 1 with a message on any error; verify and compare exit 1 on any finding that is not
// allowed.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx := context.Background()
	args := os.Args[2:]
	var err error
	switch os.Args[1] {
	case "prepare":
		err = cmdPrepare(ctx, args)
	case "write":
		err = cmdWrite(ctx, args)
	case "topics":
		err = cmdTopics(args)
	case "wait":
		err = cmdWait(args)
	case "dump":
		err = cmdDump(args)
	case "verify":
		err = cmdVerify(args)
	case "compare":
		err = cmdCompare(args)
	case "report":
		err = cmdReport(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "outbox-compat %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: outbox-compat prepare|write|topics|wait|dump|verify|compare|report [flags] (see test/compat/main.go)")
	os.Exit(2)
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
