package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	crdbpgx "github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/geolog/geolog/client"
)

// written is what one transaction wrote for one range.
type written struct {
	next uint64              // the range's new position
	last client.StoredRecord // the last record written (to Mark)
	rows int
}

// writeBatch writes recs (in offset order per range) and the new
// positions of their ranges in one transaction. Per range, under the
// cursor row's lock: records below the stored position were written
// before (by this sink before a crash, or by the range's previous owner)
// and are skipped; the rest must start at the stored position (ErrGap
// otherwise), are inserted, and the position moves past them. The
// transaction may be retried by ExecuteTx; its result is computed afresh
// each time.
func (s *Sink) writeBatch(ctx context.Context, recs []client.StoredRecord) (map[uint32]written, error) {
	byRange := map[uint32][]client.StoredRecord{}
	for _, r := range recs {
		byRange[r.Range] = append(byRange[r.Range], r)
	}
	for rng, rs := range byRange {
		// A range revoked and granted again is fetched again from its
		// position: records of both ownerships may be in one batch.
		slices.SortStableFunc(rs, func(a, b client.StoredRecord) int { return cmpUint(a.Offset, b.Offset) })
		byRange[rng] = slices.CompactFunc(rs, func(a, b client.StoredRecord) bool { return a.Offset == b.Offset })
	}
	rngs := slices.Sorted(maps.Keys(byRange)) // one lock order: no deadlock between sinks
	var out map[uint32]written
	cc := &commitCapture{pool: s.pool}
	err := crdbpgx.ExecuteTx(ctx, cc, pgx.TxOptions{}, func(tx pgx.Tx) error {
		out = map[uint32]written{}
		for _, rng := range rngs {
			w, err := s.writeRange(ctx, tx, rng, byRange[rng])
			if err != nil {
				return err
			}
			out[rng] = w
		}
		return nil
	})
	if err == nil && cc.commitErr != nil {
		err = fmt.Errorf("%w: %v", ErrCommitFailed, cc.commitErr)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// writeRange is one range's part of writeBatch's transaction.
func (s *Sink) writeRange(ctx context.Context, tx pgx.Tx, rng uint32, recs []client.StoredRecord) (written, error) {
	tag, err := tx.Exec(ctx, `INSERT INTO `+cursorTable+` (sink, stream, range_id, next_offset) VALUES ($1, $2, $3, $4)
		ON CONFLICT (sink, stream, range_id) DO NOTHING`, s.cfg.Group, s.cfg.Stream, int64(rng), int64(recs[0].Offset))
	if err != nil {
		return written{}, err
	}
	fresh := tag.RowsAffected() == 1 // the range's first write: it starts where its records do
	var next int64
	if err := tx.QueryRow(ctx, `SELECT next_offset FROM `+cursorTable+` WHERE sink = $1 AND stream = $2 AND range_id = $3 FOR UPDATE`,
		s.cfg.Group, s.cfg.Stream, int64(rng)).Scan(&next); err != nil {
		return written{}, err
	}
	i, _ := slices.BinarySearchFunc(recs, uint64(next), func(r client.StoredRecord, off uint64) int {
		return cmpUint(r.Offset, off)
	})
	recs = recs[i:]
	if len(recs) == 0 {
		return written{next: uint64(next)}, nil
	}
	if !fresh && recs[0].Offset != uint64(next) {
		return written{}, fmt.Errorf("%w: range %d stands at %d, the next record is at %d", ErrGap, rng, next, recs[0].Offset)
	}
	if err := s.insertRows(ctx, tx, recs); err != nil {
		return written{}, err
	}
	end := recs[len(recs)-1].Offset + 1
	if _, err := tx.Exec(ctx, `UPDATE `+cursorTable+` SET next_offset = $4, updated_at = now()
		WHERE sink = $1 AND stream = $2 AND range_id = $3`, s.cfg.Group, s.cfg.Stream, int64(rng), int64(end)); err != nil {
		return written{}, err
	}
	return written{next: end, last: recs[len(recs)-1], rows: len(recs)}, nil
}

// insertRows inserts recs with one statement (arrays unnested: the same
// SQL on PostgreSQL and CockroachDB).
func (s *Sink) insertRows(ctx context.Context, tx pgx.Tx, recs []client.StoredRecord) error {
	rngs, offs := make([]int64, len(recs)), make([]int64, len(recs))
	keys, values := make([][]byte, len(recs)), make([][]byte, len(recs))
	times := make([]time.Time, len(recs))
	for i, r := range recs {
		rngs[i], offs[i], keys[i], values[i], times[i] = int64(r.Range), int64(r.Offset), r.Key, r.Value, r.AppendTime
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.cfg.Table+` (src_stream, src_range, src_offset, key, value, append_time)
		SELECT $1, r, o, k, v, t FROM unnest($2::INT[], $3::BIGINT[], $4::BYTEA[], $5::BYTEA[], $6::TIMESTAMPTZ[]) AS x(r, o, k, v, t)`,
		s.cfg.Stream, rngs, offs, keys, values, times)
	return err
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// commitCapture is the pool as crdbpgx.Conn, remembering COMMIT's error:
// crdb.ExecuteInTx ignores it (on CockroachDB, RELEASE SAVEPOINT has
// committed already), but on PostgreSQL COMMIT is where a transaction
// can still fail, and a sink must not mark records written that are not.
type commitCapture struct {
	pool      *pgxpool.Pool
	commitErr error
}

func (c *commitCapture) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

func (c *commitCapture) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := c.pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &capturedTx{Tx: tx, c: c}, nil
}

type capturedTx struct {
	pgx.Tx
	c *commitCapture
}

func (t *capturedTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.c.commitErr = err
	return err
}
