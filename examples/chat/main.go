// Command chat is an example chat application built only on geolog's
// public Go SDK (package client): conversations are keys of one stream,
// a device's per-conversation cursor is its delivered/read receipt, and
// message ids make sends idempotent. See README.md.
//
//	chat create [--ranges 4]
//	chat send --from DEVICE --conv CONV [--id ID] TEXT...
//	chat sync --device DEVICE --conv CONV[,CONV...] [--ack]
//	chat ack --device DEVICE CONV[@OFFSET]...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/geolog/geolog/client"
)

const usage = `usage: chat [--addr host:port,...] [--stream chat] <command> [flags]

commands:
  create [--ranges 4]                       create the stream
  send --from DEVICE --conv CONV [--id ID] TEXT...
                                            send a message (--id: resend under an earlier id)
  sync --device DEVICE --conv CONV[,CONV] [--ack]
                                            print what DEVICE has not acknowledged
  ack --device DEVICE CONV[@OFFSET]...      acknowledge (delivered/read receipt)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run runs one command and returns the exit code: 0 done, 1 failed, 2 usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	addr := fs.String("addr", envOr("GEOLOG_ADDR", "127.0.0.1:7400"), "node addresses")
	stream := fs.String("stream", "chat", "the stream of conversations")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		if err == nil {
			fs.Usage()
		}
		return 2
	}
	c, err := client.New(*addr, client.RequestTimeout(30*time.Second))
	if err != nil {
		fmt.Fprintln(stderr, "chat:", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	if cmd == "create" {
		err = create(ctx, c, *stream, rest, stdout)
	} else {
		err = runApp(ctx, c, *stream, cmd, rest, stdout)
	}
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "chat: %v\n%s", err, usage)
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "chat:", err)
		return 1
	}
	return 0
}

// usageError is a wrong command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func runApp(ctx context.Context, c *client.Client, stream, cmd string, args []string, stdout io.Writer) error {
	switch cmd {
	case "send", "sync", "ack":
	default:
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
	app, err := NewApp(ctx, c, stream)
	if err != nil {
		return err
	}
	defer app.Close()
	switch cmd {
	case "send":
		return send(ctx, app, args, stdout)
	case "sync":
		return syncCmd(ctx, app, args, stdout)
	default:
		return ack(ctx, app, args, stdout)
	}
}

func create(ctx context.Context, c *client.Client, stream string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
	ranges := fs.Uint("ranges", 4, "ranges of the stream")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: stream, RangeCount: uint32(*ranges)}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "created %s with %d ranges\n", stream, *ranges)
	return nil
}

func send(ctx context.Context, app *App, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	from := fs.String("from", "", "the sending device")
	conv := fs.String("conv", "", "the conversation")
	id := fs.String("id", "", "the message id (default: a new one)")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if *from == "" || *conv == "" || fs.NArg() == 0 {
		return usageError{"send needs --from, --conv and a text"}
	}
	m, err := app.Send(ctx, *conv, *from, *id, strings.Join(fs.Args(), " "))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sent %s id=%s at %d/%d\n", m.Conv, m.ID, m.Range, m.Offset)
	return nil
}

func syncCmd(ctx context.Context, app *App, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sync", flag.ContinueOnError)
	device := fs.String("device", "", "the syncing device")
	convs := fs.String("conv", "", "its conversations, comma-separated")
	andAck := fs.Bool("ack", false, "acknowledge what was printed")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if *device == "" || *convs == "" || fs.NArg() != 0 {
		return usageError{"sync needs --device and --conv"}
	}
	list := strings.Split(*convs, ",")
	res, err := app.Sync(ctx, *device, list)
	if err != nil {
		return err
	}
	counts := map[string]int{}
	for _, m := range res.Messages {
		counts[m.Conv]++
		fmt.Fprintf(stdout, "[%s %d] %s: %s\n", m.Conv, m.Offset, m.From, m.Text)
	}
	for _, conv := range list {
		fmt.Fprintf(stdout, "%s: %d new, next %d\n", conv, counts[conv], res.Next[conv])
	}
	if res.Duplicates > 0 {
		fmt.Fprintf(stdout, "dropped %d resent message(s) already delivered\n", res.Duplicates)
	}
	if !*andAck {
		return nil
	}
	for _, conv := range list {
		if res.Next[conv] == 0 {
			continue // an empty range: nothing to acknowledge (0 would mean "the tail now")
		}
		if err := ackOne(ctx, app, *device, conv, res.Next[conv], stdout); err != nil {
			return err
		}
	}
	return nil
}

func ack(ctx context.Context, app *App, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ack", flag.ContinueOnError)
	device := fs.String("device", "", "the acknowledging device")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if *device == "" || fs.NArg() == 0 {
		return usageError{"ack needs --device and a conversation"}
	}
	for _, arg := range fs.Args() {
		conv, at, found := strings.Cut(arg, "@")
		var upto uint64
		if found {
			n, err := strconv.ParseUint(at, 10, 64)
			if err != nil || n == 0 {
				return usageError{fmt.Sprintf("bad offset in %q", arg)}
			}
			upto = n
		}
		if err := ackOne(ctx, app, *device, conv, upto, stdout); err != nil {
			return err
		}
	}
	return nil
}

func ackOne(ctx context.Context, app *App, device, conv string, upto uint64, stdout io.Writer) error {
	at, applied, err := app.Ack(ctx, device, conv, upto)
	if err != nil {
		return err
	}
	if applied {
		fmt.Fprintf(stdout, "acked %s at %d\n", conv, at)
	} else {
		fmt.Fprintf(stdout, "%s already acked at %d\n", conv, at)
	}
	return nil
}
