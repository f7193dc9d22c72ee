package homing

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/jackc/pgx/v5"
)

// Tests that need the SQL store on PostgreSQL at SERIALIZABLE: migrations,
// real concurrency, commit-time serialization failures, a cut connection.

func TestMigrationsIdempotent(t *testing.T) {
	s, url := newSQLStore(t) // migrated once by OpenSQL
	ctx := ctxT(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	// Concurrent migrators on a fresh database: all succeed, each version
	// is recorded once.
	s2 := openSQLAt(t, urlOfFreshDB(t), func(c *SQLConfig) { c.SkipMigrate = true })
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s2.Migrate(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate %d: %v", i, err)
		}
	}
	for _, st := range []*SQLStore{s, s2} {
		var n, maxV int64
		if err := st.pool.QueryRow(ctx, `SELECT count(*), max(version) FROM schema_migrations`).Scan(&n, &maxV); err != nil {
			t.Fatal(err)
		}
		if n != int64(len(migrations)) || maxV != SchemaVersion() {
			t.Fatalf("schema_migrations has %d rows up to %d, want %d up to %d", n, maxV, len(migrations), SchemaVersion())
		}
		// The tables are usable.
		if _, err := st.CreateHomes(ctx, []HomeSpec{{Key: RangeKey{Stream: "m", Range: 0}, Region: "us"}}); err != nil {
			t.Fatalf("CreateHomes after migrations: %v", err)
		}
	}
	// Reopening migrates nothing and keeps the data.
	s3 := openSQLAt(t, url)
	homes, err := s3.Homes(ctx, []RangeKey{{Stream: "m", Range: 0}})
	if err != nil || homes[0].Epoch != 1 {
		t.Fatalf("after reopen: %v %v", homes, err)
	}
	// A schema that is not ours is reported as such, not as an outage.
	if _, err := s3.pool.Exec(ctx, `DROP TABLE range_epochs`); err != nil {
		t.Fatal(err)
	}
	_, err = s3.History(ctx, RangeKey{Stream: "m", Range: 0})
	if !errors.Is(err, ErrSchema) || IsRetriable(err) {
		t.Fatalf("History without its table: %v, want ErrSchema (final)", err)
	}
}

func urlOfFreshDB(t *testing.T) string {
	_, url := newSQLStore(t, func(c *SQLConfig) { c.SkipMigrate = true })
	return url
}

// TestCommitTimeSerializationFailure builds a write skew that PostgreSQL
// detects only at the second transaction's COMMIT. crdb.ExecuteTx ignores
// COMMIT's error; runTx must notice it and run the body again, or the
// second write would be lost while runTx reports success.
func TestCommitTimeSerializationFailure(t *testing.T) {
	s, _ := newSQLStore(t)
	ctx := ctxT(t)
	if _, err := s.pool.Exec(ctx, `CREATE TABLE skew (k TEXT PRIMARY KEY, v INT8 NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO skew VALUES ('a', 0), ('b', 0)`); err != nil {
		t.Fatal(err)
	}
	sum := func(tx pgx.Tx) (int64, error) {
		var n int64
		err := tx.QueryRow(ctx, `SELECT sum(v) FROM skew`).Scan(&n)
		return n, err
	}
	aRead, bRead, aWrote, bWrote, aDone := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var bAttempts int
	var bLastSum int64
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() {
		first := true
		errA <- s.runTx(ctx, false, func(tx pgx.Tx) error {
			if _, err := sum(tx); err != nil {
				return err
			}
			if first {
				close(aRead)
				<-bRead
			}
			if _, err := tx.Exec(ctx, `UPDATE skew SET v = 1 WHERE k = 'a'`); err != nil {
				return err
			}
			if first {
				first = false
				close(aWrote)
				<-bWrote
			}
			return nil
		})
		close(aDone)
	}()
	go func() {
		errB <- s.runTx(ctx, false, func(tx pgx.Tx) error {
			bAttempts++
			n, err := sum(tx)
			if err != nil {
				return err
			}
			bLastSum = n
			if bAttempts == 1 {
				<-aRead
				close(bRead)
				<-aWrote
			}
			if _, err := tx.Exec(ctx, `UPDATE skew SET v = 1 WHERE k = 'b'`); err != nil {
				return err
			}
			if bAttempts == 1 {
				close(bWrote)
				<-aDone // A commits first; B's COMMIT then fails
			}
			return nil
		})
	}()
	if err := <-errA; err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := <-errB; err != nil {
		t.Fatalf("B: %v", err)
	}
	var a, b int64
	if err := s.pool.QueryRow(ctx, `SELECT (SELECT v FROM skew WHERE k = 'a'), (SELECT v FROM skew WHERE k = 'b')`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a != 1 || b != 1 {
		t.Fatalf("a=%d b=%d: a committed write was lost", a, b)
	}
	if bAttempts < 2 || bLastSum != 1 {
		t.Fatalf("B ran %d times, last saw sum %d: want a retry that saw A's write", bAttempts, bLastSum)
	}
}

// TestConcurrentTakeovers races takeovers of overlapping range sets from
// three contenders (two regions, one of them twice) over separate
// connections: every range gets exactly one new epoch (invariant 5).
func TestConcurrentTakeovers(t *testing.T) {
	setup, url := newSQLStore(t)
	ctx := ctxT(t)
	type contender struct {
		to     string
		lo, hi uint32
		store  *SQLStore
	}
	contenders := []*contender{{to: "eu", lo: 0, hi: 59}, {to: "ap", lo: 20, hi: 79}, {to: "eu", lo: 40, hi: 79}}
	for _, c := range contenders {
		c.store = openSQLAt(t, url)
	}
	// Region us had two nodes; both expired long ago.
	for id := uint64(1); id <= 2; id++ {
		if _, err := setup.Heartbeat(ctx, HeartbeatRequest{NodeID: id, Region: "us"}); err != nil {
			t.Fatal(err)
		}
		if _, err := setup.Heartbeat(ctx, HeartbeatRequest{NodeID: id, Region: "us", Epoch: 1, ExpirationNanos: int64(5 * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	const rounds, ranges = 5, 80
	for round := range rounds {
		stream := fmt.Sprintf("race%d", round)
		var specs []HomeSpec
		for r := range uint32(ranges) {
			specs = append(specs, HomeSpec{Key: RangeKey{Stream: stream, Range: r}, Region: "us"})
		}
		if _, err := setup.CreateHomes(ctx, specs); err != nil {
			t.Fatal(err)
		}
		results := make([]TakeoverResult, len(contenders))
		errs := make([]error, len(contenders))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range contenders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := TakeoverRequest{From: "us", To: c.to, NowNanos: int64(time.Hour), MaxOffsetNanos: int64(500 * time.Millisecond)}
				for r := c.lo; r <= c.hi; r++ {
					req.Ranges = append(req.Ranges, TakeoverRange{Key: RangeKey{Stream: stream, Range: r}, Epoch: 1, StartOffset: uint64(100 + i)})
				}
				<-start
				results[i], errs[i] = c.store.Takeover(ctx, req)
			}()
		}
		close(start)
		wg.Wait()
		grants := map[RangeKey][]int{}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d contender %d: %v", round, i, err)
			}
			for _, o := range results[i].Ranges {
				if o.Outcome == Granted {
					grants[o.Key] = append(grants[o.Key], i)
				}
			}
		}
		all, err := setup.StreamHistory(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		var perRange []EpochRecord
		for r := range uint32(ranges) {
			key := RangeKey{Stream: stream, Range: r}
			hist, err := setup.History(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			perRange = append(perRange, hist...)
		}
		if !slices.Equal(all, perRange) {
			t.Fatalf("round %d: StreamHistory %+v, the ranges' histories %+v", round, all, perRange)
		}
		for r := range uint32(ranges) {
			key := RangeKey{Stream: stream, Range: r}
			winners := grants[key]
			if len(winners) != 1 {
				t.Fatalf("round %d: %s granted to contenders %v, want exactly one", round, key, winners)
			}
			w := contenders[winners[0]]
			hist, err := setup.History(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if len(hist) != 2 || hist[1].Epoch != 2 || hist[1].Region != w.to || hist[1].StartOffset != uint64(100+winners[0]) {
				t.Fatalf("round %d: %s history %+v, want epochs 1 and 2 (to %s)", round, key, hist, w.to)
			}
		}
		t.Logf("round %d: contenders granted %d, %d, %d of %d ranges", round, results[0].Granted(), results[1].Granted(), results[2].Granted(), ranges)
	}
}

// TestConcurrentRehomes: planned rehome is a compare-and-set. Of several
// concurrent prepares to different targets exactly one wins, and of several
// concurrent completions exactly one moves the range.
func TestConcurrentRehomes(t *testing.T) {
	setup, url := newSQLStore(t)
	ctx := ctxT(t)
	targets := []string{"eu", "ap", "sa", "af"}
	stores := make([]*SQLStore, len(targets))
	for i := range stores {
		stores[i] = openSQLAt(t, url)
	}
	for r := range uint32(8) {
		key := RangeKey{Stream: "move", Range: r}
		if _, err := setup.CreateHomes(ctx, []HomeSpec{{Key: key, Region: "us"}}); err != nil {
			t.Fatal(err)
		}
		race := func(step func(i int) error) []int {
			errs := make([]error, len(stores))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range stores {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs[i] = step(i)
				}()
			}
			close(start)
			wg.Wait()
			var won []int
			for i, err := range errs {
				switch {
				case err == nil:
					won = append(won, i)
				case !errors.Is(err, ErrEpochMismatch):
					t.Fatalf("range %d contender %d: %v, want success or ErrEpochMismatch", r, i, err)
				}
			}
			return won
		}
		won := race(func(i int) error {
			_, err := stores[i].PrepareRehome(ctx, RehomeRequest{Key: key, Epoch: 1, To: targets[i]})
			return err
		})
		if len(won) != 1 {
			t.Fatalf("range %d: prepares won by %v, want exactly one", r, won)
		}
		target := targets[won[0]]
		won = race(func(i int) error {
			_, err := stores[i].CompleteRehome(ctx, RehomeRequest{Key: key, Epoch: 1, To: target, StartOffset: uint64(i), NowNanos: int64(time.Hour)})
			return err
		})
		if len(won) != 1 {
			t.Fatalf("range %d: completions won by %v, want exactly one", r, won)
		}
		hist, err := setup.History(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(hist) != 2 || hist[1].Region != target || hist[1].StartOffset != uint64(won[0]) {
			t.Fatalf("range %d: history %+v", r, hist)
		}
	}
}

// TestLeaseStoreOutage cuts the connection to the lease store: the home
// node keeps acking until its last expiration minus the max offset, then
// refuses with a retriable error; no epoch is granted while the store is
// unreachable; both resume after.
func TestLeaseStoreOutage(t *testing.T) {
	direct, url := newSQLStore(t)
	ctx := ctxT(t)
	cfgURL, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, fmt.Sprintf("%s:%d", cfgURL.Host, cfgURL.Port))
	viaProxy := func() *SQLStore {
		return openSQLAt(t, urlVia(t, url, proxy.Addr()), func(c *SQLConfig) { c.ConnectTimeout = 2 * time.Second })
	}
	key := RangeKey{Stream: "chat", Range: 0}
	if _, err := direct.CreateHomes(ctx, []HomeSpec{{Key: key, Region: "us"}}); err != nil {
		t.Fatal(err)
	}
	var clock fakeClock
	home, err := Start(Config{NodeID: 1, Region: "us", Store: viaProxy(), Now: clock.Now, ManualHeartbeats: true,
		LivenessTTL: 5 * time.Second, MaxClockOffset: 500 * time.Millisecond, HeartbeatTimeout: 5 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	clock.Set(time.Second)
	if err := home.Refresh(ctx); err != nil {
		t.Fatalf("refresh: %v", err)
	}
	if e, err := home.Check("chat", 0); err != nil || e != 1 {
		t.Fatalf("check: %d %v", e, err)
	}
	if got := home.MayServeUntil(); got != time.Unix(0, int64(5500*time.Millisecond)) {
		t.Fatalf("MayServeUntil %v, want 5.5s", got)
	}

	proxy.Cut()
	clock.Set(2 * time.Second)
	if err := home.Refresh(ctx); !errors.Is(err, ErrStoreUnavailable) || !IsRetriable(err) {
		t.Fatalf("refresh while cut: %v, want retriable ErrStoreUnavailable", err)
	}
	clock.Set(5500*time.Millisecond - 1)
	if _, err := home.Check("chat", 0); err != nil {
		t.Fatalf("check before the lease's end: %v", err)
	}
	clock.Set(5500 * time.Millisecond)
	_, err = home.Check("chat", 0)
	if !errors.Is(err, ErrLeaseExpired) || !errors.Is(err, ErrStoreUnavailable) || !IsRetriable(err) || apierr.As(err).Code != apierr.LeaseExpired {
		t.Fatalf("check at the lease's end: %v, want retriable ErrLeaseExpired caused by the store", err)
	}

	// No epoch while the store is unreachable, even long after us expired.
	takerStore, err := OpenSQL(ctx, SQLConfig{URL: urlVia(t, url, proxy.Addr()), ConnectTimeout: time.Second, SkipMigrate: true})
	if err == nil {
		takerStore.Close()
		t.Fatal("OpenSQL through a cut connection succeeded")
	}
	if !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("OpenSQL through a cut connection: %v, want ErrStoreUnavailable", err)
	}
	_, err = home.Takeover(ctx, "eu", []TakeoverRange{{Key: key, Epoch: 1}}) // wrong way round, but it must not even get there
	if !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("takeover while cut: %v, want ErrStoreUnavailable", err)
	}
	homes, err := direct.Homes(ctx, []RangeKey{key})
	if err != nil || homes[0].Epoch != 1 || homes[0].Region != "us" {
		t.Fatalf("home after takeover attempts while cut: %+v %v", homes, err)
	}

	proxy.Restore()
	clock.Set(6 * time.Second)
	deadline := time.Now().Add(time.Minute)
	for {
		// The pool may first hand out a connection the cut broke.
		if err = home.Refresh(ctx); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("refresh after restore: %v", err)
	}
	if e, err := home.Check("chat", 0); err != nil || e != 1 {
		t.Fatalf("check after restore: %d %v", e, err)
	}
	if got := home.MayServeUntil(); got != time.Unix(0, int64(10500*time.Millisecond)) {
		t.Fatalf("MayServeUntil after restore %v, want 10.5s", got)
	}
	// And the home is live again: no takeover.
	_, err = direct.Takeover(ctx, TakeoverRequest{From: "us", To: "eu", NowNanos: int64(7 * time.Second), MaxOffsetNanos: int64(500 * time.Millisecond),
		Ranges: []TakeoverRange{{Key: key, Epoch: 1}}})
	if !errors.Is(err, ErrHomeLive) {
		t.Fatalf("takeover from a live home: %v, want ErrHomeLive", err)
	}
}

// TestFailoverDrivers runs two nodes' drivers on PostgreSQL: the eu node
// cannot take over while the us node is live; after the us node's lease ran
// out it can, the us node can no longer ack, and when it comes back it
// learns it was fenced and that the range is gone.
func TestFailoverDrivers(t *testing.T) {
	setup, url := newSQLStore(t)
	ctx := ctxT(t)
	if _, err := setup.CreateHomes(ctx, []HomeSpec{{Key: RangeKey{Stream: "chat", Range: 0}, Region: "us"}, {Key: RangeKey{Stream: "chat", Range: 1}, Region: "us"}}); err != nil {
		t.Fatal(err)
	}
	var usClock, euClock fakeClock
	start := func(id uint64, region string, clock *fakeClock) *Homes {
		// Virtual time; a heartbeat is not cut off however busy the
		// machine (the default bound is real time).
		h, err := Start(Config{NodeID: id, Region: region, Store: openSQLAt(t, url), Now: clock.Now, ManualHeartbeats: true,
			LivenessTTL: 5 * time.Second, MaxClockOffset: 500 * time.Millisecond, HeartbeatTimeout: time.Minute, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		if err := h.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		return h
	}
	us := start(1, "us", &usClock)
	eu := start(2, "eu", &euClock)
	select {
	case <-us.Changed():
	default:
		t.Fatal("us driver did not signal its first homes")
	}
	if e, err := us.Check("chat", 1); err != nil || e != 1 {
		t.Fatalf("us check: %d %v", e, err)
	}
	if _, err := eu.Check("chat", 1); !errors.Is(err, ErrNotHome) {
		t.Fatalf("eu check: %v, want ErrNotHome", err)
	}
	ranges := []TakeoverRange{{Key: RangeKey{Stream: "chat", Range: 0}, Epoch: 1, StartOffset: 10}, {Key: RangeKey{Stream: "chat", Range: 1}, Epoch: 1, StartOffset: 20}}
	euClock.Set(5 * time.Second) // us's expiration; + max offset is still live
	if _, err := eu.Takeover(ctx, "us", ranges); !errors.Is(err, ErrHomeLive) || !IsRetriable(err) {
		t.Fatalf("takeover from a live region: %v, want retriable ErrHomeLive", err)
	}
	// us is partitioned from the store (it stops heartbeating); eu's clock
	// passes us's expiration + max offset.
	euClock.Set(5*time.Second + 500*time.Millisecond + 1)
	res, err := eu.Takeover(ctx, "us", ranges)
	if err != nil || res.Granted() != 2 || len(res.Fenced) != 1 || res.Fenced[0].Epoch != 2 {
		t.Fatalf("takeover: %+v %v", res, err)
	}
	if e, err := eu.Check("chat", 1); err != nil || e != 2 {
		t.Fatalf("eu check after takeover: %d %v", e, err)
	}
	if l, err := eu.Lease("chat", 0); err != nil || l.StartOffset != 10 {
		t.Fatalf("eu lease after takeover: %+v %v", l, err)
	}
	// us's clock is within the max offset of eu's: it has stopped acking.
	usClock.Set(5*time.Second + 1)
	if _, err := us.Check("chat", 1); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("old home check: %v, want ErrLeaseExpired", err)
	}
	// us comes back: its heartbeat finds its epoch incremented, it starts
	// over at the new epoch and has no homes.
	usClock.Set(8 * time.Second)
	if err := us.Refresh(ctx); err != nil {
		t.Fatalf("us refresh: %v", err)
	}
	if v := us.View(); v.LivenessEpoch != 2 || len(v.Homes()) != 0 {
		t.Fatalf("us view after return: epoch %d homes %v", v.LivenessEpoch, v.Homes())
	}
	if _, err := us.Check("chat", 1); !errors.Is(err, ErrNotHome) {
		t.Fatalf("old home check after return: %v, want ErrNotHome", err)
	}
}
