package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/geolog/geolog/client"
)

// Config is what a Sink needs.
type Config struct {
	Stream string
	// Group is the consumer group, and the sink's name in the cursor
	// table: sinks of one name share the stream's ranges.
	Group string
	// InstanceID makes the member static: a sink restarted under the same
	// id takes its ranges back at once. Empty: a dynamic member.
	InstanceID string
	// Table receives the records (created if missing).
	Table string
	// BatchRecordsMax bounds the records written per transaction.
	BatchRecordsMax int
	// CommitGeolog also commits the group's positions to geolog every
	// CommitInterval, for lag and tools; PostgreSQL stays the truth.
	CommitGeolog   bool
	CommitInterval time.Duration
	SessionTimeout time.Duration
	Logger         hclog.Logger
}

// ErrGap is returned when the records to write do not continue a range
// where the cursor table says it stands: records between were never
// written and are not offered (retention deleted them, or the group's
// position was moved past them). The sink stops rather than skip them.
var ErrGap = errors.New("pgsink: records do not continue the range's cursor")

// ErrCommitFailed is returned when a transaction's COMMIT failed (which
// crdbpgx.ExecuteTx does not report on PostgreSQL).
var ErrCommitFailed = errors.New("pgsink: commit failed")

var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// cursorTable holds each sink's position per range: the source of truth.
const cursorTable = "geolog_sink_cursors"

// Sink consumes a stream into PostgreSQL exactly once: each batch of
// records and the new positions of their ranges are written in one
// transaction, and a range starts (after a restart or a rebalance) where
// the cursor table says.
type Sink struct {
	cfg  Config
	pool *pgxpool.Pool
	c    *client.Client
	log  hclog.Logger
}

// NewSink checks cfg and creates the tables if they are missing.
func NewSink(ctx context.Context, c *client.Client, pool *pgxpool.Pool, cfg Config) (*Sink, error) {
	if !tableName.MatchString(cfg.Table) {
		return nil, fmt.Errorf("pgsink: table name %q is not [a-z_][a-z0-9_]*", cfg.Table)
	}
	if cfg.Stream == "" || cfg.Group == "" || cfg.BatchRecordsMax < 1 || cfg.CommitInterval <= 0 {
		return nil, fmt.Errorf("pgsink: a stream, a group, a positive batch size and commit interval are needed")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	s := &Sink{cfg: cfg, pool: pool, c: c, log: cfg.Logger.Named("pgsink")}
	return s, s.migrate(ctx)
}

// migrate creates the tables. Two sinks starting at once may race on
// CREATE TABLE IF NOT EXISTS (PostgreSQL then reports a duplicate type):
// it is retried.
func (s *Sink) migrate(ctx context.Context) error {
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + cursorTable + ` (
			sink TEXT NOT NULL, stream TEXT NOT NULL, range_id INT NOT NULL,
			next_offset BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
			PRIMARY KEY (sink, stream, range_id))`,
		// No unique key on the source position on purpose: the cursor in
		// the same transaction is what keeps each record to one row.
		`CREATE TABLE IF NOT EXISTS ` + s.cfg.Table + ` (
			id BIGSERIAL PRIMARY KEY, src_stream TEXT NOT NULL, src_range INT NOT NULL,
			src_offset BIGINT NOT NULL, key BYTEA, value BYTEA, append_time TIMESTAMPTZ,
			inserted_at TIMESTAMPTZ NOT NULL DEFAULT now())`,
	}
	var err error
	for attempt := range 5 {
		err = nil
		for _, q := range stmts {
			if _, err = s.pool.Exec(ctx, q); err != nil {
				break
			}
		}
		if err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return fmt.Errorf("pgsink: create tables: %w", err)
}

// position is the StartPositions function: the cursor table's position
// of a range, if it has one.
func (s *Sink) position(ctx context.Context, rng uint32) (uint64, bool, error) {
	var next int64
	err := s.pool.QueryRow(ctx, `SELECT next_offset FROM `+cursorTable+` WHERE sink = $1 AND stream = $2 AND range_id = $3`,
		s.cfg.Group, s.cfg.Stream, int64(rng)).Scan(&next)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("pgsink: read the position of range %d: %w", rng, err)
	}
	s.log.Debug("range starts at the cursor table's position", "range", rng, "offset", next)
	return uint64(next), true, nil
}

// Run consumes until ctx ends (nil) or a final error: a group consumer
// with manual commits, starting each range at the cursor table's
// position, feeds batches of up to BatchRecordsMax records to writeBatch;
// what a transaction wrote is then marked processed, and committed to
// geolog every CommitInterval if CommitGeolog.
func (s *Sink) Run(ctx context.Context) error {
	opts := []client.GroupOpt{client.ManualCommit(), client.StartPositions(s.position),
		client.SessionTimeout(s.cfg.SessionTimeout), client.BufferedBatchesMax(16)}
	if s.cfg.InstanceID != "" {
		opts = append(opts, client.GroupInstanceID(s.cfg.InstanceID))
	}
	g, err := s.c.NewGroupConsumer(s.cfg.Stream, s.cfg.Group, opts...)
	if err != nil {
		return err
	}
	defer g.Close() // commits what was marked (written), leaves
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recs := make(chan client.StoredRecord, s.cfg.BatchRecordsMax)
	errc := make(chan error, 1)
	go func() {
		for rec, err := range g.Records(ctx) {
			if err != nil {
				errc <- err
				return
			}
			select {
			case recs <- rec:
			case <-ctx.Done():
			}
		}
	}()
	return s.loop(ctx, g, recs, errc)
}

// loop is Run's writer: batch, write, mark, commit to geolog now and then.
func (s *Sink) loop(ctx context.Context, g *client.GroupConsumer, recs <-chan client.StoredRecord, errc <-chan error) error {
	lastCommit, rows := time.Now(), 0
	for {
		batch, err := s.collect(ctx, recs, errc)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		ws, err := s.writeBatch(ctx, batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, w := range ws {
			rows += w.rows
			if w.rows > 0 {
				g.Mark(w.last)
			}
		}
		if s.cfg.CommitGeolog && time.Since(lastCommit) >= s.cfg.CommitInterval {
			lastCommit = time.Now()
			if err := g.Commit(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("commit to geolog (lag only; PostgreSQL holds the positions)", "error", err)
			}
			s.log.Info("written", "rows", rows, "ranges", g.Assigned())
		}
	}
}

// collect waits for a record, then takes what else is ready, up to
// BatchRecordsMax.
func (s *Sink) collect(ctx context.Context, recs <-chan client.StoredRecord, errc <-chan error) ([]client.StoredRecord, error) {
	var batch []client.StoredRecord
	select {
	case r := <-recs:
		batch = append(batch, r)
	case err := <-errc:
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for len(batch) < s.cfg.BatchRecordsMax {
		select {
		case r := <-recs:
			batch = append(batch, r)
		default:
			return batch, nil
		}
	}
	return batch, nil
}
