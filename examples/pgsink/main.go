// Command pgsink consumes a geolog stream into PostgreSQL (or
// CockroachDB) exactly once: every batch of records and the positions of
// their ranges are written in one transaction, and the positions in the
// database are where consumption resumes after a crash or a rebalance.
// Several pgsink processes of one --group share the stream's ranges. See
// README.md.
//
//	pgsink --addr 127.0.0.1:7400 --stream orders --pg postgres://... [--group pgsink] [--table geolog_records]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/geolog/geolog/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// run runs the sink until ctx ends; it returns 0 after a clean stop, 1 on
// an error, 2 on a wrong command line.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("pgsink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", envOr("GEOLOG_ADDR", "127.0.0.1:7400"), "geolog node addresses")
	pgURL := fs.String("pg", os.Getenv("PGSINK_URL"), "PostgreSQL or CockroachDB URL (default $PGSINK_URL)")
	cfg := Config{Logger: hclog.New(&hclog.LoggerOptions{Name: "pgsink", Output: stderr, Level: hclog.Info})}
	fs.StringVar(&cfg.Stream, "stream", "", "the stream to consume")
	fs.StringVar(&cfg.Group, "group", "pgsink", "the consumer group, and the sink's name in the cursor table")
	fs.StringVar(&cfg.InstanceID, "instance", "", "a static member id: a restart takes the ranges back at once")
	fs.StringVar(&cfg.Table, "table", "geolog_records", "the table receiving the records")
	fs.IntVar(&cfg.BatchRecordsMax, "batch", 500, "records per transaction, at most")
	fs.BoolVar(&cfg.CommitGeolog, "commit-geolog", true, "also commit positions to geolog (lag, geolog groups describe)")
	fs.DurationVar(&cfg.CommitInterval, "commit-interval", time.Second, "how often positions are committed to geolog")
	fs.DurationVar(&cfg.SessionTimeout, "session", 10*time.Second, "the group session timeout")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 || cfg.Stream == "" || *pgURL == "" {
		if err == nil {
			fmt.Fprintln(stderr, "pgsink: --stream and --pg are required")
		}
		return 2
	}
	if err := sink(ctx, *addr, *pgURL, cfg); err != nil {
		cfg.Logger.Error("stopped", "error", err)
		return 1
	}
	return 0
}

func sink(ctx context.Context, addr, pgURL string, cfg Config) error {
	c, err := client.New(addr, client.Logger(cfg.Logger))
	if err != nil {
		return err
	}
	defer c.Close()
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := NewSink(ctx, c, pool, cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
