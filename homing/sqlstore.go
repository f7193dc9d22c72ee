package homing

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	crdbpgx "github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// txRetryWaitMax caps the wait between two attempts of a transaction that
// met a conflict (the backoff doubles from 1 ms, jittered). On PostgreSQL
// every pair of overlapping heartbeats conflicts (the UPDATE of a node's
// own liveness row scans the small table, and a sequential scan takes a
// predicate lock on all of it), so one heartbeat of an overlapping wave
// commits per attempt: the wait must grow past the time a wave takes on a
// busy machine, or the same contenders meet again and again.
const txRetryWaitMax = 100 * time.Millisecond

// SQLConfig configures a SQLStore. Zero values take the documented defaults.
type SQLConfig struct {
	// URL is the lease store's connection string (postgres://...). Required.
	URL string
	// MaxConns bounds the pool, default 4: a node runs one heartbeat at a
	// time plus the occasional takeover or rehome.
	MaxConns int32
	// ConnectTimeout bounds establishing one connection, default 5s.
	ConnectTimeout time.Duration
	// TxAttemptsMax bounds the fresh transactions one call may run when
	// serialization conflicts abort it, default 50 (cockroach-go's own
	// default bound); the caller's context bounds the time they take.
	TxAttemptsMax int
	// Migrate applies the schema migrations at open (default true; set
	// SkipMigrate to leave the schema alone).
	SkipMigrate bool
	// Tracer sees every statement (statement counts, OpenTelemetry).
	Tracer pgx.QueryTracer
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// RequireVerifyFull refuses a URL that lets a connection go without
	// TLS or without verifying the server's certificate and name: only
	// sslmode=verify-full passes (geologd sets it unless --insecure).
	RequireVerifyFull bool
}

// verifiesServer reports whether every connection cfg may make (its
// fallbacks included) uses TLS and verifies the server's chain and name:
// pgx's sslmode=verify-full. The other modes leave no TLS config on some
// fallback (disable, allow, prefer) or skip Go's verification (require,
// verify-ca).
func verifiesServer(cfg *pgconn.Config) bool {
	if cfg.TLSConfig == nil || cfg.TLSConfig.InsecureSkipVerify {
		return false
	}
	for _, fb := range cfg.Fallbacks {
		if fb.TLSConfig == nil || fb.TLSConfig.InsecureSkipVerify {
			return false
		}
	}
	return true
}

// reloadRoots makes the pool's connections verify the server against the
// CA bundle that the URL's sslrootcert names as it is when each connection
// is made, so that a CA rotated on disk is used without a restart (the
// client certificate and key, sslcert and sslkey, pgx itself reads again
// for every connection). Connections already open keep going until the
// pool retires them.
//
// pgx reads sslrootcert only when it parses a URL, so the pool's
// BeforeConnect parses it again and keeps the bundle it read; the TLS
// configs, changed here before any connection uses them, verify with
// VerifyConnection against that bundle what Go's default verification
// would: the chain, the server's name, server authentication. Files that
// do not load (a poll between two renames) fail that connection only, with
// pgx's error, and the next one reads them again. Only a config that
// verifies the server (verifiesServer) is changed.
func reloadRoots(pcfg *pgxpool.Config, url string) {
	cc := &pcfg.ConnConfig.Config
	if !verifiesServer(cc) {
		return
	}
	var roots atomic.Pointer[x509.CertPool]
	roots.Store(cc.TLSConfig.RootCAs)
	verifyCurrent(cc.TLSConfig, &roots)
	for _, fb := range cc.Fallbacks {
		verifyCurrent(fb.TLSConfig, &roots)
	}
	pcfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		fresh, err := pgconn.ParseConfig(url)
		if err != nil {
			return fmt.Errorf("homing: lease store TLS files: %w", err)
		}
		if !verifiesServer(fresh) {
			return errors.New("homing: lease store URL no longer verifies the server")
		}
		roots.Store(fresh.TLSConfig.RootCAs)
		return nil
	}
}

// verifyCurrent makes c verify the server against *roots (see
// reloadRoots). InsecureSkipVerify only turns off Go's built-in check,
// which VerifyConnection replaces.
func verifyCurrent(c *tls.Config, roots *atomic.Pointer[x509.CertPool]) {
	serverName := c.ServerName
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("homing: the lease store presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots.Load(), Intermediates: inter, DNSName: serverName})
		return err
	}
}

// SQLStore is the lease store on CockroachDB, or on PostgreSQL for local
// runs and CI, through pgx. Every call is one SERIALIZABLE transaction run
// by cockroach-go's crdbpgxv5.ExecuteTx.
//
// Two things make that helper correct on PostgreSQL as well:
//
//  1. ExecuteTx retries a serialization failure by rolling back to a
//     savepoint and re-running the body in the same transaction. That is
//     CockroachDB's protocol; on PostgreSQL the transaction keeps its
//     snapshot (and a doomed one stays doomed), so the retry fails again.
//     On PostgreSQL the in-transaction retries are therefore limited to one,
//     and SQLStore runs a fresh transaction on a serialization failure
//     (bounded by TxAttemptsMax). On CockroachDB the helper's own retries
//     do the work (up to 20).
//  2. ExecuteTx ignores the error of the final COMMIT (on CockroachDB,
//     RELEASE SAVEPOINT cockroach_restart has already committed). On
//     PostgreSQL, COMMIT is where serializable transactions fail their
//     final check, so SQLStore hands ExecuteTx a pool wrapper that captures
//     COMMIT's error: a serialization failure there is retried, a lost
//     connection is ErrAmbiguousCommit. Without this, a takeover that lost
//     a race would be reported as granted.
type SQLStore struct {
	cfg          SQLConfig
	logger       hclog.Logger
	pool         *pgxpool.Pool
	cockroach    bool
	innerRetries int
}

var _ Store = (*SQLStore)(nil)

// OpenSQL connects, detects the dialect and applies the migrations.
func OpenSQL(ctx context.Context, cfg SQLConfig) (*SQLStore, error) {
	if cfg.URL == "" {
		return nil, invalidf("SQLConfig.URL is required")
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 4
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.TxAttemptsMax == 0 {
		cfg.TxAttemptsMax = 50
	}
	if cfg.MaxConns < 0 || cfg.ConnectTimeout < 0 || cfg.TxAttemptsMax < 0 {
		return nil, invalidf("SQLConfig bounds must not be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, invalidf("lease store URL: %v", err)
	}
	if cfg.RequireVerifyFull && !verifiesServer(&pcfg.ConnConfig.Config) {
		return nil, invalidf("lease store URL: TLS is required with sslmode=verify-full (and sslrootcert naming the CA); the URL allows a connection without TLS or without checking the server")
	}
	pcfg.MaxConns = cfg.MaxConns
	pcfg.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	reloadRoots(pcfg, cfg.URL)
	if cfg.Tracer != nil {
		pcfg.ConnConfig.Tracer = cfg.Tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, newErrorAlso(ErrStoreUnavailable, err, "connect: %v", err)
	}
	s := &SQLStore{cfg: cfg, logger: cfg.Logger.Named("homing-sql"), pool: pool, innerRetries: 1}
	var version string
	if err := pool.QueryRow(ctx, `SELECT version()`).Scan(&version); err != nil {
		pool.Close()
		return nil, classify(err, "detect dialect")
	}
	if strings.Contains(version, "CockroachDB") {
		s.cockroach, s.innerRetries = true, 20
	}
	s.logger.Debug("connected", "server", version, "cockroach", s.cockroach)
	if !cfg.SkipMigrate {
		if err := s.Migrate(ctx); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close implements Store.
func (s *SQLStore) Close() { s.pool.Close() }

// commitCapture is the pool as crdbpgx.Conn, whose transactions record
// COMMIT's error (which crdb.ExecuteInTx discards).
type commitCapture struct {
	pool      *pgxpool.Pool
	commitErr error
	committed bool
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
	t.c.committed = true
	t.c.commitErr = err
	return err
}

// runTx runs fn in a SERIALIZABLE transaction through crdbpgx.ExecuteTx,
// retrying serialization failures with fresh transactions, and classifies
// the outcome. fn must reset whatever it fills in: it may run many times.
func (s *SQLStore) runTx(ctx context.Context, readOnly bool, fn func(pgx.Tx) error) error {
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable}
	if readOnly {
		opts.AccessMode = pgx.ReadOnly
	}
	ictx := crdb.WithMaxRetries(ctx, s.innerRetries)
	var err error
	began := time.Now()
	attempt := 1
	defer func() {
		if attempt > 1 {
			s.logger.Debug("transaction retried", "attempts", attempt, "took", time.Since(began), "error", err)
		}
	}()
	for ; attempt <= s.cfg.TxAttemptsMax; attempt++ {
		conn := &commitCapture{pool: s.pool}
		// Every transaction goes through ExecuteTx, on PostgreSQL too (its
		// SAVEPOINT and RELEASE cost two round trips there, but the path
		// tested is the one CockroachDB runs).
		err = crdbpgx.ExecuteTx(ictx, conn, opts, fn)
		if err == nil && conn.committed && conn.commitErr != nil {
			err = conn.commitErr
			if !retryable(err) {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) && !errors.Is(err, pgx.ErrTxCommitRollback) {
					// The connection failed during COMMIT: it may have
					// committed.
					return newErrorAlso(ErrAmbiguousCommit, err, "commit: %v", err)
				}
			}
		}
		if err == nil || !retryable(err) || ctx.Err() != nil {
			break
		}
		// Both contenders of a conflict retry; spread them a little.
		if werr := backoff.Sleep(ctx, backoff.Delay(attempt-1, time.Millisecond, txRetryWaitMax, nil)); werr != nil {
			break
		}
	}
	if err == nil {
		return nil
	}
	return classify(err, "")
}

// retryable reports a conflict that a fresh transaction may not hit.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01"
	}
	return false
}

// classify turns an error from the database into the package's errors. Our
// own errors (from the decisions inside fn) pass through unchanged.
func classify(err error, what string) error {
	var he *homingError
	if errors.As(err, &he) {
		return err
	}
	if what != "" {
		what += ": "
	}
	var amb *crdb.AmbiguousCommitError
	if errors.As(err, &amb) {
		return newErrorAlso(ErrAmbiguousCommit, err, "%s%v", what, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "42") {
		// Undefined table or column, syntax: the schema is not ours.
		return newErrorAlso(ErrSchema, err, "%s%v", what, err)
	}
	// Connection failures, timeouts, server shutdown, conflicts that
	// outlasted the attempts: nothing was committed, try again later.
	return newErrorAlso(ErrStoreUnavailable, err, "%s%v", what, err)
}

// Column lists and scanners.

const homeColumns = `stream, range_id, home_region, epoch, start_offset, prev_region, moving_to, drain_version`

func scanHome(row pgx.Row) (Home, error) {
	var h Home
	var rangeID, epoch, start, drain int64
	if err := row.Scan(&h.Key.Stream, &rangeID, &h.Region, &epoch, &start, &h.PrevRegion, &h.MovingTo, &drain); err != nil {
		return Home{}, err
	}
	if rangeID < 0 || rangeID > int64(^uint32(0)) || epoch <= 0 || start < 0 || drain < 0 {
		return Home{}, newError(ErrSchema, "range_homes row %s/%d holds out-of-range values", h.Key.Stream, rangeID)
	}
	h.Key.Range, h.Epoch, h.StartOffset, h.DrainVersion = uint32(rangeID), uint64(epoch), uint64(start), uint64(drain)
	return h, nil
}

func queryHomes(ctx context.Context, tx pgx.Tx, sql string, args ...any) ([]Home, error) {
	return queryRows(ctx, tx, scanHomes, sql, args...)
}

// queryRows runs sql in tx and hands its rows to scan.
func queryRows[T any](ctx context.Context, tx pgx.Tx, scan func(pgx.Rows) ([]T, error), sql string, args ...any) ([]T, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return scan(rows)
}

// scanHomes reads home rows, sorted by key, and closes rows.
func scanHomes(rows pgx.Rows) ([]Home, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Home, error) { return scanHome(r) })
	if err != nil {
		return nil, err
	}
	// Sorted here, not by ORDER BY: collations differ between databases.
	slices.SortFunc(out, func(a, b Home) int { return compareKeys(a.Key, b.Key) })
	return out, nil
}

const livenessColumns = `node_id, region, epoch, expiration_nanos, homes_seen`

func scanLiveness(row pgx.Row) (Liveness, error) {
	var l Liveness
	var id, epoch, seen int64
	if err := row.Scan(&id, &l.Region, &epoch, &l.ExpirationNanos, &seen); err != nil {
		return Liveness{}, err
	}
	if id <= 0 || epoch <= 0 || seen < 0 {
		return Liveness{}, newError(ErrSchema, "liveness row %d holds out-of-range values", id)
	}
	l.NodeID, l.Epoch, l.HomesSeen = uint64(id), uint64(epoch), uint64(seen)
	return l, nil
}

func queryLiveness(ctx context.Context, tx pgx.Tx, sql string, args ...any) ([]Liveness, error) {
	return queryRows(ctx, tx, scanLivenesses, sql, args...)
}

// scanLivenesses reads liveness rows, sorted by node, and closes rows.
func scanLivenesses(rows pgx.Rows) ([]Liveness, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Liveness, error) { return scanLiveness(r) })
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Liveness) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return out, nil
}

// keyArrays splits keys into the parallel arrays that unnest takes.
func keyArrays(keys []RangeKey) ([]string, []int64) {
	streams := make([]string, len(keys))
	ranges := make([]int64, len(keys))
	for i, k := range keys {
		streams[i], ranges[i] = k.Stream, int64(k.Range)
	}
	return streams, ranges
}

// homesByKey reads the records of keys, locking them.
func homesByKey(ctx context.Context, tx pgx.Tx, keys []RangeKey) (map[RangeKey]Home, error) {
	streams, ranges := keyArrays(keys)
	homes, err := queryHomes(ctx, tx, `SELECT `+homeColumns+` FROM range_homes
		WHERE (stream, range_id) IN (SELECT s, r FROM unnest($1::TEXT[], $2::INT8[]) AS t(s, r))
		FOR UPDATE`, streams, ranges)
	if err != nil {
		return nil, err
	}
	out := make(map[RangeKey]Home, len(homes))
	for _, h := range homes {
		out[h.Key] = h
	}
	return out, nil
}

func homeByKey(ctx context.Context, tx pgx.Tx, key RangeKey) (*Home, error) {
	homes, err := queryHomes(ctx, tx, `SELECT `+homeColumns+` FROM range_homes WHERE stream = $1 AND range_id = $2 FOR UPDATE`,
		key.Stream, int64(key.Range))
	if err != nil || len(homes) == 0 {
		return nil, err
	}
	return &homes[0], nil
}

// bumpVersions increments the homes version of each region (creating it at
// 2, as if it had been 1), in one statement.
func bumpVersions(ctx context.Context, tx pgx.Tx, regions ...string) error {
	uniq := []string{}
	for _, r := range regions {
		if r != "" && !slices.Contains(uniq, r) {
			uniq = append(uniq, r)
		}
	}
	if len(uniq) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO regions (region, homes_version) SELECT r, 2 FROM unnest($1::TEXT[]) AS t(r)
		ON CONFLICT (region) DO UPDATE SET homes_version = regions.homes_version + 1`, uniq)
	return err
}

func regionVersion(ctx context.Context, tx pgx.Tx, region string) (uint64, error) {
	var v int64
	err := tx.QueryRow(ctx, `SELECT homes_version FROM regions WHERE region = $1`, region).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, newError(ErrSchema, "region %s has a negative homes version", region)
	}
	return uint64(v), nil
}

func insertEpochs(ctx context.Context, tx pgx.Tx, kind string, grantedNanos int64, homes []Home) error {
	sql, args := insertEpochsSQL(kind, grantedNanos, homes)
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

func insertEpochsSQL(kind string, grantedNanos int64, homes []Home) (string, []any) {
	n := len(homes)
	streams, regions, prevs := make([]string, n), make([]string, n), make([]string, n)
	ranges, epochs, starts := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, h := range homes {
		streams[i], ranges[i], epochs[i], regions[i], starts[i], prevs[i] = h.Key.Stream, int64(h.Key.Range), int64(h.Epoch), h.Region, int64(h.StartOffset), h.PrevRegion
	}
	return `INSERT INTO range_epochs (stream, range_id, epoch, region, start_offset, prev_region, kind, granted_nanos)
		SELECT s, r, e, reg, o, p, $7, $8 FROM unnest($1::TEXT[], $2::INT8[], $3::INT8[], $4::TEXT[], $5::INT8[], $6::TEXT[]) AS t(s, r, e, reg, o, p)`,
		[]any{streams, ranges, epochs, regions, starts, prevs, kind, grantedNanos}
}

// writeHomes overwrites existing home records.
func writeHomes(ctx context.Context, tx pgx.Tx, homes []Home) error {
	sql, args := writeHomesSQL(homes)
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

func writeHomesSQL(homes []Home) (string, []any) {
	n := len(homes)
	streams, regions, prevs, moving := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ranges, epochs, starts, drains := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, h := range homes {
		streams[i], ranges[i], regions[i], epochs[i] = h.Key.Stream, int64(h.Key.Range), h.Region, int64(h.Epoch)
		starts[i], prevs[i], moving[i], drains[i] = int64(h.StartOffset), h.PrevRegion, h.MovingTo, int64(h.DrainVersion)
	}
	return `UPDATE range_homes SET home_region = t.reg, epoch = t.e, start_offset = t.o, prev_region = t.p,
			moving_to = t.m, drain_version = t.d
		FROM unnest($1::TEXT[], $2::INT8[], $3::TEXT[], $4::INT8[], $5::INT8[], $6::TEXT[], $7::TEXT[], $8::INT8[])
			AS t(s, r, reg, e, o, p, m, d)
		WHERE range_homes.stream = t.s AND range_homes.range_id = t.r`,
		[]any{streams, ranges, regions, epochs, starts, prevs, moving, drains}
}

// Heartbeat implements Store.
func (s *SQLStore) Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error) {
	if err := req.validate(); err != nil {
		return HeartbeatResult{}, err
	}
	var res HeartbeatResult
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		res = HeartbeatResult{}
		if req.Epoch != 0 {
			// The common case in one round trip. The update is
			// decideHeartbeat's extend branch (same region, same non-zero
			// epoch: expiration never moves back, homes_seen is the
			// request's); anything else falls through to the general path
			// (heartbeatSlow). The region's version and, only if it differs from the
			// one the node knows, its homes are read in the same trip.
			b := &pgx.Batch{}
			b.Queue(`UPDATE liveness
				SET expiration_nanos = GREATEST(expiration_nanos, $4), homes_seen = $5, updated_nanos = $6
				WHERE node_id = $1 AND region = $2 AND epoch = $3
				RETURNING `+livenessColumns,
				int64(req.NodeID), req.Region, int64(req.Epoch), req.ExpirationNanos, int64(req.HomesSeen), req.NowNanos)
			b.Queue(`SELECT COALESCE((SELECT homes_version FROM regions WHERE region = $1), 0)`, req.Region)
			b.Queue(`SELECT `+homeColumns+` FROM range_homes
				WHERE home_region = $1 AND COALESCE((SELECT homes_version FROM regions WHERE region = $1), 0) <> $2`,
				req.Region, int64(req.HomesKnown))
			extended, err := heartbeatFast(ctx, tx, b, req, &res)
			if err != nil {
				return err
			}
			if extended {
				return nil
			}
		}
		return heartbeatSlow(ctx, tx, req, &res)
	})
	if err != nil {
		return HeartbeatResult{}, err
	}
	return res, nil
}

// heartbeatSlow is Heartbeat's general path: registration, a new
// liveness epoch, or a refused extension (decideHeartbeat), then the
// region's version and, if it changed, its homes.
func heartbeatSlow(ctx context.Context, tx pgx.Tx, req HeartbeatRequest, res *HeartbeatResult) error {
	ls, err := queryLiveness(ctx, tx, `SELECT `+livenessColumns+` FROM liveness WHERE node_id = $1 FOR UPDATE`, int64(req.NodeID))
	if err != nil {
		return err
	}
	var cur *Liveness
	if len(ls) > 0 {
		cur = &ls[0]
	}
	d, err := decideHeartbeat(cur, req)
	if err != nil {
		return err
	}
	switch {
	case d.insert:
		if _, err := tx.Exec(ctx, `INSERT INTO liveness (node_id, region, epoch, expiration_nanos, homes_seen, updated_nanos)
			VALUES ($1, $2, $3, $4, $5, $6)`,
			int64(d.next.NodeID), d.next.Region, int64(d.next.Epoch), d.next.ExpirationNanos, int64(d.next.HomesSeen), req.NowNanos); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO regions (region, homes_version) VALUES ($1, 1) ON CONFLICT (region) DO NOTHING`, req.Region); err != nil {
			return err
		}
	case d.write:
		if _, err := tx.Exec(ctx, `UPDATE liveness SET expiration_nanos = $2, homes_seen = $3, updated_nanos = $4 WHERE node_id = $1`,
			int64(d.next.NodeID), d.next.ExpirationNanos, int64(d.next.HomesSeen), req.NowNanos); err != nil {
			return err
		}
	}
	res.Liveness, res.Extended = d.next, d.extended
	v, err := regionVersion(ctx, tx, req.Region)
	if err != nil {
		return err
	}
	res.HomesVersion = v
	if v != req.HomesKnown {
		homes, err := queryHomes(ctx, tx, `SELECT `+homeColumns+` FROM range_homes WHERE home_region = $1`, req.Region)
		if err != nil {
			return err
		}
		res.HomesChanged, res.Homes = true, homes
	}
	return nil
}

// heartbeatFast reads the answers to Heartbeat's one-trip batch into res;
// false if the record was not extended (res is then left empty).
func heartbeatFast(ctx context.Context, tx pgx.Tx, b *pgx.Batch, req HeartbeatRequest, res *HeartbeatResult) (bool, error) {
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	l, err := scanLiveness(br.QueryRow())
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, br.Close()
	case err != nil:
		return false, err
	}
	var v int64
	if err := br.QueryRow().Scan(&v); err != nil {
		return false, err
	}
	if v < 0 {
		return false, newError(ErrSchema, "region %s has a negative homes version", req.Region)
	}
	rows, err := br.Query()
	if err != nil {
		return false, err
	}
	homes, err := scanHomes(rows)
	if err != nil {
		return false, err
	}
	res.Liveness, res.Extended, res.HomesVersion = l, true, uint64(v)
	if res.HomesVersion != req.HomesKnown {
		res.HomesChanged, res.Homes = true, homes
	}
	return true, br.Close()
}

// CreateHomes implements Store.
func (s *SQLStore) CreateHomes(ctx context.Context, specs []HomeSpec) ([]Home, error) {
	if err := validateSpecs(specs); err != nil {
		return nil, err
	}
	keys := make([]RangeKey, len(specs))
	for i, sp := range specs {
		keys[i] = sp.Key
	}
	var out []Home
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		cur, err := homesByKey(ctx, tx, keys)
		if err != nil {
			return err
		}
		out = make([]Home, len(specs))
		var created []Home
		var regions []string
		for i, sp := range specs {
			var c *Home
			if h, ok := cur[sp.Key]; ok {
				c = &h
			}
			h, isNew := decideCreate(c, sp)
			if isNew {
				created = append(created, h)
				regions = append(regions, h.Region)
			}
			out[i] = h
		}
		if len(created) == 0 {
			return nil
		}
		n := len(created)
		streams, regs := make([]string, n), make([]string, n)
		ranges, starts := make([]int64, n), make([]int64, n)
		for i, h := range created {
			streams[i], ranges[i], regs[i], starts[i] = h.Key.Stream, int64(h.Key.Range), h.Region, int64(h.StartOffset)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO range_homes (stream, range_id, home_region, epoch, start_offset, prev_region, moving_to, drain_version)
			SELECT s, r, reg, 1, o, '', '', 0 FROM unnest($1::TEXT[], $2::INT8[], $3::TEXT[], $4::INT8[]) AS t(s, r, reg, o)`,
			streams, ranges, regs, starts); err != nil {
			return err
		}
		if err := insertEpochs(ctx, tx, KindCreate, 0, created); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, regions...)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Homes implements Store.
func (s *SQLStore) Homes(ctx context.Context, keys []RangeKey) ([]Home, error) {
	if err := validateKeys(keys); err != nil {
		return nil, err
	}
	var out []Home
	err := s.runTx(ctx, true, func(tx pgx.Tx) error {
		streams, ranges := keyArrays(keys)
		homes, err := queryHomes(ctx, tx, `SELECT `+homeColumns+` FROM range_homes
			WHERE (stream, range_id) IN (SELECT s, r FROM unnest($1::TEXT[], $2::INT8[]) AS t(s, r))`, streams, ranges)
		if err != nil {
			return err
		}
		byKey := make(map[RangeKey]Home, len(homes))
		for _, h := range homes {
			byKey[h.Key] = h
		}
		out = make([]Home, len(keys))
		for i, k := range keys {
			h, ok := byKey[k]
			if !ok {
				h = Home{Key: k}
			}
			out[i] = h
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RegionHomes implements Store.
func (s *SQLStore) RegionHomes(ctx context.Context, region string) ([]Home, uint64, error) {
	if err := validateRegion("home", region); err != nil {
		return nil, 0, err
	}
	var homes []Home
	var version uint64
	err := s.runTx(ctx, true, func(tx pgx.Tx) error {
		var err error
		if version, err = regionVersion(ctx, tx, region); err != nil {
			return err
		}
		homes, err = queryHomes(ctx, tx, `SELECT `+homeColumns+` FROM range_homes WHERE home_region = $1`, region)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return homes, version, nil
}

// Liveness implements Store.
func (s *SQLStore) Liveness(ctx context.Context, region string) ([]Liveness, error) {
	if region != "" {
		if err := validateRegion("node", region); err != nil {
			return nil, err
		}
	}
	var out []Liveness
	err := s.runTx(ctx, true, func(tx pgx.Tx) error {
		var err error
		if region == "" {
			out, err = queryLiveness(ctx, tx, `SELECT `+livenessColumns+` FROM liveness`)
		} else {
			out, err = queryLiveness(ctx, tx, `SELECT `+livenessColumns+` FROM liveness WHERE region = $1`, region)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Takeover implements Store.
func (s *SQLStore) Takeover(ctx context.Context, req TakeoverRequest) (TakeoverResult, error) {
	if err := req.validate(); err != nil {
		return TakeoverResult{}, err
	}
	keys := make([]RangeKey, len(req.Ranges))
	for i, r := range req.Ranges {
		keys[i] = r.Key
	}
	var res TakeoverResult
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		res = TakeoverResult{}
		nodes, err := queryLiveness(ctx, tx, `SELECT `+livenessColumns+` FROM liveness WHERE region = $1 FOR UPDATE`, req.From)
		if err != nil {
			return err
		}
		cur, err := homesByKey(ctx, tx, keys)
		if err != nil {
			return err
		}
		plan, err := decideTakeover(req, nodes, cur)
		if err != nil {
			return err
		}
		res = plan.result
		if len(plan.granted) == 0 {
			return nil
		}
		ids, epochs := make([]int64, len(plan.result.Fenced)), make([]int64, len(plan.result.Fenced))
		for i, l := range plan.result.Fenced {
			ids[i], epochs[i] = int64(l.NodeID), int64(l.Epoch)
		}
		if len(ids) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE liveness SET epoch = t.e FROM unnest($1::INT8[], $2::INT8[]) AS t(id, e)
				WHERE liveness.node_id = t.id`, ids, epochs); err != nil {
				return err
			}
		}
		if err := writeHomes(ctx, tx, plan.granted); err != nil {
			return err
		}
		if err := insertEpochs(ctx, tx, KindTakeover, req.NowNanos, plan.granted); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, req.From, req.To)
	})
	if err != nil {
		return TakeoverResult{}, err
	}
	return res, nil
}

// PrepareRehome implements Store.
func (s *SQLStore) PrepareRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := req.validate(true); err != nil {
		return Home{}, err
	}
	var out Home
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		cur, err := homeByKey(ctx, tx, req.Key)
		if err != nil {
			return err
		}
		var fromVersion uint64
		if cur != nil {
			if fromVersion, err = regionVersion(ctx, tx, cur.Region); err != nil {
				return err
			}
		}
		next, changed, err := decidePrepareRehome(cur, req, fromVersion)
		if err != nil {
			return err
		}
		out = next
		if !changed {
			return nil
		}
		if err := writeHomes(ctx, tx, []Home{next}); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, next.Region)
	})
	if err != nil {
		return Home{}, err
	}
	return out, nil
}

// CompleteRehome implements Store.
func (s *SQLStore) CompleteRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := req.validate(true); err != nil {
		return Home{}, err
	}
	var out Home
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		cur, err := homeByKey(ctx, tx, req.Key)
		if err != nil {
			return err
		}
		var nodes []Liveness
		if cur != nil {
			nodes, err = queryLiveness(ctx, tx, `SELECT `+livenessColumns+` FROM liveness WHERE region = $1`, cur.Region)
			if err != nil {
				return err
			}
		}
		next, err := decideCompleteRehome(cur, req, nodes, nil)
		if err != nil {
			return err
		}
		out = next
		if err := writeHomes(ctx, tx, []Home{next}); err != nil {
			return err
		}
		if err := insertEpochs(ctx, tx, KindRehome, req.NowNanos, []Home{next}); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, next.PrevRegion, next.Region)
	})
	if err != nil {
		return Home{}, err
	}
	return out, nil
}

// CancelRehome implements Store.
func (s *SQLStore) CancelRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := req.validate(false); err != nil {
		return Home{}, err
	}
	var out Home
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		cur, err := homeByKey(ctx, tx, req.Key)
		if err != nil {
			return err
		}
		next, changed, err := decideCancelRehome(cur, req)
		if err != nil {
			return err
		}
		out = next
		if !changed {
			return nil
		}
		if err := writeHomes(ctx, tx, []Home{next}); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, next.Region)
	})
	if err != nil {
		return Home{}, err
	}
	return out, nil
}

// History implements Store.
func (s *SQLStore) History(ctx context.Context, key RangeKey) ([]EpochRecord, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	var out []EpochRecord
	err := s.runTx(ctx, true, func(tx pgx.Tx) error {
		out = []EpochRecord{}
		rows, err := tx.Query(ctx, `SELECT epoch, region, start_offset, prev_region, kind, granted_nanos FROM range_epochs
			WHERE stream = $1 AND range_id = $2 ORDER BY epoch`, key.Stream, int64(key.Range))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r := EpochRecord{Key: key}
			var epoch, start int64
			if err := rows.Scan(&epoch, &r.Region, &start, &r.PrevRegion, &r.Kind, &r.GrantedNanos); err != nil {
				return err
			}
			if epoch <= 0 || start < 0 {
				return newError(ErrSchema, "range_epochs row of %s holds out-of-range values", key)
			}
			r.Epoch, r.StartOffset = uint64(epoch), uint64(start)
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// StreamHistory implements Store.
func (s *SQLStore) StreamHistory(ctx context.Context, stream string) ([]EpochRecord, error) {
	if err := validateStream(stream); err != nil {
		return nil, err
	}
	var out []EpochRecord
	err := s.runTx(ctx, true, func(tx pgx.Tx) error {
		out = []EpochRecord{}
		rows, err := tx.Query(ctx, `SELECT range_id, epoch, region, start_offset, prev_region, kind, granted_nanos FROM range_epochs
			WHERE stream = $1 ORDER BY range_id, epoch`, stream)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r := EpochRecord{Key: RangeKey{Stream: stream}}
			var rng, epoch, start int64
			if err := rows.Scan(&rng, &epoch, &r.Region, &start, &r.PrevRegion, &r.Kind, &r.GrantedNanos); err != nil {
				return err
			}
			if rng < 0 || rng > math.MaxUint32 || epoch <= 0 || start < 0 {
				return newError(ErrSchema, "range_epochs row of stream %s holds out-of-range values", stream)
			}
			r.Key.Range, r.Epoch, r.StartOffset = uint32(rng), uint64(epoch), uint64(start)
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// String describes the store for logs.
func (s *SQLStore) String() string {
	dialect := "postgresql"
	if s.cockroach {
		dialect = "cockroachdb"
	}
	return fmt.Sprintf("homing.SQLStore(%s)", dialect)
}

// DeleteHomes implements Store.
func (s *SQLStore) DeleteHomes(ctx context.Context, stream string) error {
	if err := validateStream(stream); err != nil {
		return err
	}
	return s.runTx(ctx, false, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `DELETE FROM range_homes WHERE stream = $1 RETURNING home_region`, stream)
		if err != nil {
			return err
		}
		var regions []string
		for rows.Next() {
			var r string
			if err := rows.Scan(&r); err != nil {
				rows.Close()
				return err
			}
			regions = append(regions, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM range_epochs WHERE stream = $1`, stream); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM stream_splits WHERE stream = $1`, stream); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, regions...)
	})
}
