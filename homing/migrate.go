package homing

import (
	"context"
	"errors"
	"time"

	"github.com/geolog/geolog/internal/backoff"
	"github.com/jackc/pgx/v5"
)

// migration is one versioned schema step. Statements are in the SQL subset
// that CockroachDB and PostgreSQL share, and idempotent (IF NOT EXISTS), so
// that a step interrupted before its version was recorded can run again.
type migration struct {
	version int64
	name    string
	stmts   []string
}

// migrations are applied in order; append only, never edit a released one.
var migrations = []migration{{
	version: 1,
	name:    "liveness, regions, range_homes, range_epochs",
	stmts: []string{
		// One row per node, heartbeated by that node only.
		`CREATE TABLE IF NOT EXISTS liveness (
			node_id          INT8 NOT NULL PRIMARY KEY,
			region           TEXT NOT NULL,
			epoch            INT8 NOT NULL CHECK (epoch > 0),
			expiration_nanos INT8 NOT NULL,
			homes_seen       INT8 NOT NULL DEFAULT 0,
			updated_nanos    INT8 NOT NULL DEFAULT 0
		)`,
		`CREATE INDEX IF NOT EXISTS liveness_region_idx ON liveness (region)`,
		// One row per region: the version of the set of ranges homed there,
		// bumped by every change to it, so a heartbeat re-reads the homes
		// only when they changed.
		`CREATE TABLE IF NOT EXISTS regions (
			region        TEXT NOT NULL PRIMARY KEY,
			homes_version INT8 NOT NULL
		)`,
		// One row per range: where it is homed, at which epoch.
		`CREATE TABLE IF NOT EXISTS range_homes (
			stream        TEXT NOT NULL,
			range_id      INT8 NOT NULL,
			home_region   TEXT NOT NULL,
			epoch         INT8 NOT NULL CHECK (epoch > 0),
			start_offset  INT8 NOT NULL,
			prev_region   TEXT NOT NULL DEFAULT '',
			moving_to     TEXT NOT NULL DEFAULT '',
			drain_version INT8 NOT NULL DEFAULT 0,
			PRIMARY KEY (stream, range_id)
		)`,
		`CREATE INDEX IF NOT EXISTS range_homes_region_idx ON range_homes (home_region)`,
		// Every epoch ever granted: the fork points.
		`CREATE TABLE IF NOT EXISTS range_epochs (
			stream        TEXT NOT NULL,
			range_id      INT8 NOT NULL,
			epoch         INT8 NOT NULL,
			region        TEXT NOT NULL,
			start_offset  INT8 NOT NULL,
			prev_region   TEXT NOT NULL,
			kind          TEXT NOT NULL,
			granted_nanos INT8 NOT NULL,
			PRIMARY KEY (stream, range_id, epoch)
		)`,
	},
}, {
	version: 2,
	name:    "stream_splits",
	stmts: []string{
		// One row per version of a stream's range map made by a split:
		// the region whose split it is (the parent's home), so that two
		// regions never split ranges of one stream at the same version.
		`CREATE TABLE IF NOT EXISTS stream_splits (
			stream        TEXT NOT NULL,
			map_version   INT8 NOT NULL CHECK (map_version > 0),
			region        TEXT NOT NULL,
			parent_range  INT8 NOT NULL,
			split_at      INT8 NOT NULL,
			claimed_nanos INT8 NOT NULL,
			PRIMARY KEY (stream, map_version)
		)`,
	},
}}

// SchemaVersion is the newest schema version this code knows.
func SchemaVersion() int64 { return migrations[len(migrations)-1].version }

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version       INT8 NOT NULL PRIMARY KEY,
	name          TEXT NOT NULL,
	applied_nanos INT8 NOT NULL
)`

// migrateAttemptsMax bounds the attempts of each step: concurrent migrators
// race on the catalog (PostgreSQL reports a unique violation on its catalog
// tables when two CREATE TABLE IF NOT EXISTS of one name overlap).
const migrateAttemptsMax = 10

// Migrate applies the migrations the database lacks, in order, each in one
// transaction together with its schema_migrations row. It is idempotent and
// safe to run from several nodes at once. A database with versions newer
// than this code knows is left alone (migrations only add, so older code
// keeps working during a rolling upgrade).
func (s *SQLStore) Migrate(ctx context.Context) error {
	if err := s.migrateStep(ctx, "create schema_migrations", func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, createMigrationsTable)
		return err
	}); err != nil {
		return err
	}
	for _, m := range migrations {
		applied := false
		err := s.migrateStep(ctx, m.name, func(tx pgx.Tx) error {
			applied = false
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM schema_migrations WHERE version = $1`, m.version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			for _, stmt := range m.stmts {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name, applied_nanos) VALUES ($1, $2, $3)`,
				m.version, m.name, time.Now().UnixNano()); err != nil {
				return err
			}
			applied = true
			return nil
		})
		if err != nil {
			return err
		}
		if applied {
			s.logger.Info("applied migration", "version", m.version, "name", m.name)
		}
	}
	var newest int64
	if err := s.runTx(ctx, true, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM schema_migrations`).Scan(&newest)
	}); err != nil {
		return err
	}
	if newest > SchemaVersion() {
		s.logger.Warn("lease store schema is newer than this code", "schema_version", newest, "known_version", SchemaVersion())
	}
	return nil
}

// migrateStep runs fn in a transaction, retrying (boundedly) the conflicts
// that concurrent migrators cause.
func (s *SQLStore) migrateStep(ctx context.Context, name string, fn func(pgx.Tx) error) error {
	var err error
	for attempt := 1; attempt <= migrateAttemptsMax; attempt++ {
		err = s.runTx(ctx, false, fn)
		if err == nil {
			return nil
		}
		var pgErr interface{ SQLState() string }
		if !errors.As(err, &pgErr) {
			break
		}
		switch pgErr.SQLState() {
		case "23505", "42P07", "42710", "40001", "40P01": // unique violation, duplicate table/object, retry
		default:
			return newErrorAlso(ErrSchema, err, "migration %q: %v", name, err)
		}
		if werr := backoff.Sleep(ctx, backoff.Delay(attempt-1, 5*time.Millisecond, 50*time.Millisecond, nil)); werr != nil {
			break
		}
	}
	if errors.Is(err, ErrStoreUnavailable) {
		return err
	}
	return newErrorAlso(ErrSchema, err, "migration %q: %v", name, err)
}
