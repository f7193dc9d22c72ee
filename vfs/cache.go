package vfs

import (
	"container/list"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// Cache is an FS over another (the base) that bounds the descriptors its
// open files hold, node-wide: a File opened through it holds a base
// descriptor only while it is in use or may not be let go of, and an idle
// one is closed, least recently used first, once more than DescriptorsMax
// are open, and reopened on its next call. A node with thousands of
// idle ranges then holds descriptors for the files in use, not for every
// segment of every range.
//
// What it promises on top of the FS contract:
//
//  1. A descriptor is never closed during a call on its File (a read, a
//     write, a Datasync), nor while its file holds a write or truncation
//     that no Datasync has covered since: a write-back error can then
//     only be reported to the descriptor that wrote, so the fsync
//     contract (FS, 1 and 3) is the base's, unchanged. A failed Datasync
//     leaves its File dirty, holding its descriptor until Close.
//  2. A File whose name no longer reaches it (Remove, or Rename over it,
//     through this Cache) keeps its descriptor until Close: it could not
//     be reopened. A File follows a Rename of its own name.
//  3. Reopening uses the flags of the first open without O_CREATE, O_EXCL
//     and O_TRUNC, so it sees the same bytes.
//
// The bound is soft: when every open descriptor is in use, dirty or
// pinned by a Remove, a new one is opened anyway (Stats counts them) and
// the excess is closed as files go idle. Files, directories and renames
// of directories holding open Files must not be changed behind the
// Cache's back (through the base, or another process).
//
// Lock takes an in-process lock only (no descriptor): the caller must
// keep other processes out of the directories, as a node does by holding
// the base's Lock on its data directory. Other calls pass through.
type Cache struct {
	base           FS
	descriptorsMax int

	// ns orders the namespace: a reopen reads a File's path and opens it
	// under the read lock, so that no Remove or Rename (write lock) moves
	// the file in between.
	ns sync.RWMutex

	mu     sync.Mutex
	idle   list.List // of *cachedFile that may be evicted; front: most recently used
	byPath map[string]map[*cachedFile]struct{}
	locks  map[string]bool
	stats  CacheStats
}

// CacheStats are a Cache's counters.
type CacheStats struct {
	// Files counts the Files open (not closed), Descriptors the base
	// descriptors they hold now, DescriptorsMax the bound.
	Files, Descriptors, DescriptorsMax int
	// DescriptorsPeak is the most descriptors held at once.
	DescriptorsPeak int
	// Opens counts OpenFile calls that opened a file, Reopens the
	// descriptors opened again for an evicted File, Evictions those
	// closed for the bound.
	Opens, Reopens, Evictions uint64
}

// NewCache returns a Cache over base holding at most about
// descriptorsMax descriptors (at least 1).
func NewCache(base FS, descriptorsMax int) *Cache {
	return &Cache{base: base, descriptorsMax: max(1, descriptorsMax),
		byPath: map[string]map[*cachedFile]struct{}{}, locks: map[string]bool{}}
}

// Stats returns the Cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.DescriptorsMax = c.descriptorsMax
	return s
}

// OpenFile opens name on the base and returns a File whose descriptor the
// Cache may close while it is idle.
func (c *Cache) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	c.ns.RLock()
	f, err := c.base.OpenFile(name, flag, perm)
	c.ns.RUnlock()
	if err != nil {
		return nil, err
	}
	cf := &cachedFile{c: c, name: name, path: filepath.Clean(name), f: f,
		reopenFlag: flag &^ (os.O_CREATE | os.O_EXCL | os.O_TRUNC)}
	if flag&os.O_TRUNC != 0 {
		cf.writesStarted = 1 // a truncation no Datasync covered yet
	}
	c.mu.Lock()
	c.register(cf)
	c.stats.Files++
	c.stats.Opens++
	c.addDescriptorLocked()
	c.idleIfEvictableLocked(cf)
	victims := c.evictLocked()
	c.mu.Unlock()
	closeVictims(victims)
	return cf, nil
}

// Remove unlinks name; Files open on it keep their descriptors (2).
func (c *Cache) Remove(name string) error {
	c.ns.Lock()
	defer c.ns.Unlock()
	path := filepath.Clean(name)
	if err := c.pinPath(path); err != nil {
		return err
	}
	if err := c.base.Remove(name); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.byPath, path)
	c.mu.Unlock()
	return nil
}

// Rename renames oldname to newname; Files open on newname keep their
// descriptors, Files open on oldname follow it (2).
func (c *Cache) Rename(oldname, newname string) error {
	c.ns.Lock()
	defer c.ns.Unlock()
	from, to := filepath.Clean(oldname), filepath.Clean(newname)
	if from == to {
		return c.base.Rename(oldname, newname)
	}
	if err := c.pinPath(to); err != nil {
		return err
	}
	if err := c.base.Rename(oldname, newname); err != nil {
		return err
	}
	c.mu.Lock()
	moved := c.byPath[from]
	delete(c.byPath, from)
	delete(c.byPath, to)
	if len(moved) > 0 {
		c.byPath[to] = moved
		for cf := range moved {
			cf.path = to
		}
	}
	c.mu.Unlock()
	return nil
}

// pinPath makes every File open on path hold a descriptor until Close,
// reopening evicted ones: path is about to stop reaching them. The caller
// holds ns for writing, so no reopen is under way.
func (c *Cache) pinPath(path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cf := range c.byPath[path] {
		if cf.f == nil {
			f, err := c.base.OpenFile(path, cf.reopenFlag, 0)
			if err != nil {
				return err
			}
			cf.f = f
			c.stats.Reopens++
			c.addDescriptorLocked()
		}
		cf.pinned = true
		c.unidleLocked(cf)
	}
	return nil
}

// ReadDir passes through.
func (c *Cache) ReadDir(dir string) ([]fs.DirEntry, error) { return c.base.ReadDir(dir) }

// Stat passes through.
func (c *Cache) Stat(name string) (fs.FileInfo, error) { return c.base.Stat(name) }

// MkdirAll passes through.
func (c *Cache) MkdirAll(dir string, perm os.FileMode) error { return c.base.MkdirAll(dir, perm) }

// SyncDir passes through.
func (c *Cache) SyncDir(dir string) error { return c.base.SyncDir(dir) }

// BootID is the base's.
func (c *Cache) BootID() string { return c.base.BootID() }

// Lock takes an in-process exclusive lock on dir, holding no descriptor;
// see the type's documentation for other processes.
func (c *Cache) Lock(dir string) (io.Closer, error) {
	path := filepath.Clean(dir)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.locks[path] {
		return nil, &fs.PathError{Op: "lock", Path: dir, Err: ErrLocked}
	}
	c.locks[path] = true
	return &cacheLock{c: c, path: path}, nil
}

type cacheLock struct {
	once sync.Once
	c    *Cache
	path string
}

func (l *cacheLock) Close() error {
	err := fs.ErrClosed
	l.once.Do(func() {
		l.c.mu.Lock()
		delete(l.c.locks, l.path)
		l.c.mu.Unlock()
		err = nil
	})
	return err
}

func (c *Cache) register(cf *cachedFile) {
	set := c.byPath[cf.path]
	if set == nil {
		set = map[*cachedFile]struct{}{}
		c.byPath[cf.path] = set
	}
	set[cf] = struct{}{}
}

func (c *Cache) unregisterLocked(cf *cachedFile) {
	if set := c.byPath[cf.path]; set != nil {
		delete(set, cf)
		if len(set) == 0 {
			delete(c.byPath, cf.path)
		}
	}
}

func (c *Cache) addDescriptorLocked() {
	c.stats.Descriptors++
	c.stats.DescriptorsPeak = max(c.stats.DescriptorsPeak, c.stats.Descriptors)
}

// idleIfEvictableLocked puts cf at the front of the idle list if its
// descriptor may be closed: held, unused, clean, reachable by its path.
func (c *Cache) idleIfEvictableLocked(cf *cachedFile) {
	if cf.elem != nil || cf.f == nil || cf.users > 0 || cf.dirty() || cf.pinned || cf.closed {
		return
	}
	cf.elem = c.idle.PushFront(cf)
}

func (c *Cache) unidleLocked(cf *cachedFile) {
	if cf.elem != nil {
		c.idle.Remove(cf.elem)
		cf.elem = nil
	}
}

// evictLocked takes the descriptors of the least recently used idle Files
// while more than descriptorsMax are open; the caller closes them after
// unlocking mu (a close may block on the device).
func (c *Cache) evictLocked() []File {
	var victims []File
	for c.stats.Descriptors > c.descriptorsMax {
		e := c.idle.Back()
		if e == nil {
			break
		}
		cf := e.Value.(*cachedFile)
		c.unidleLocked(cf)
		victims = append(victims, cf.f)
		cf.f = nil
		c.stats.Descriptors--
		c.stats.Evictions++
	}
	return victims
}

// closeVictims closes evicted descriptors. Their files are clean (1), so
// a close error carries nothing to act on.
func closeVictims(victims []File) {
	for _, f := range victims {
		f.Close()
	}
}

// cachedFile is a File of a Cache. name never changes; the rest is
// guarded by Cache.mu.
type cachedFile struct {
	c          *Cache
	name       string
	reopenFlag int

	path  string // where the file is now (follows renames)
	f     File   // nil while evicted
	users int    // calls in progress
	// writesStarted counts the writes and truncations begun,
	// writesInFlight those not finished, writesSynced the writes a
	// successful Datasync covered: the file is dirty while
	// writesSynced < writesStarted.
	writesStarted, writesSynced uint64
	writesInFlight              int
	// syncFailed is set by a failed Datasync: the file stays dirty (FS,
	// 3).
	syncFailed bool
	// unsyncedOK: the file's writes need no Datasync (Unsynced): it is
	// never dirty for want of one.
	unsyncedOK     bool
	pinned, closed bool
	elem           *list.Element // in Cache.idle
	// opening is closed when a reopen under way ends.
	opening chan struct{}
}

func (cf *cachedFile) dirty() bool {
	return cf.syncFailed || (!cf.unsyncedOK && cf.writesSynced < cf.writesStarted)
}

// Unsynced declares that f's writes need no Datasync: its writer only
// needs them to outlive the process (the page cache keeps them) and never
// syncs them, so a Cache may close the file's descriptor while it is idle
// with writes unsynced, as it does a clean file's (a write after reopens
// it). Other Files are unchanged.
func Unsynced(f File) {
	if cf, ok := f.(*cachedFile); ok {
		cf.c.mu.Lock()
		cf.unsyncedOK = true
		cf.c.idleIfEvictableLocked(cf)
		cf.c.mu.Unlock()
	}
}

// access says what a call does with the file.
type access int

const (
	accessRead access = iota
	accessWrite
	accessSync
)

// use is a call's hold on its File's descriptor.
type use struct {
	f      File
	access access
	// syncUpTo is, for a Datasync, the writes it covers if it succeeds;
	// syncCleans is false when a write was in flight as it began.
	syncUpTo   uint64
	syncCleans bool
}

// acquire returns the descriptor for a call, reopening it if it was
// evicted; the descriptor is not closed until release.
func (cf *cachedFile) acquire(a access) (use, error) {
	c := cf.c
	c.mu.Lock()
	for cf.f == nil && cf.opening != nil && !cf.closed {
		ch := cf.opening
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
	if cf.closed {
		c.mu.Unlock()
		return use{}, &fs.PathError{Op: "use", Path: cf.name, Err: fs.ErrClosed}
	}
	cf.users++
	c.unidleLocked(cf)
	if cf.f == nil {
		ch := make(chan struct{})
		cf.opening = ch
		c.mu.Unlock()
		err := cf.reopen()
		c.mu.Lock()
		cf.opening = nil
		close(ch)
		if err != nil {
			cf.users--
			c.mu.Unlock()
			return use{}, err
		}
	}
	u := use{f: cf.f, access: a}
	switch a {
	case accessWrite:
		cf.writesStarted++
		cf.writesInFlight++
	case accessSync:
		u.syncUpTo, u.syncCleans = cf.writesStarted, cf.writesInFlight == 0
	}
	c.mu.Unlock()
	return u, nil
}

// reopen opens cf's file again, unless a Remove or Rename (pinPath) did it
// meanwhile. The caller holds a use of cf (users) and has set opening.
func (cf *cachedFile) reopen() error {
	c := cf.c
	c.ns.RLock()
	defer c.ns.RUnlock()
	c.mu.Lock()
	if cf.f != nil || cf.closed {
		c.mu.Unlock()
		return nil
	}
	path := cf.path
	c.mu.Unlock()
	f, err := c.base.OpenFile(path, cf.reopenFlag, 0)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if cf.closed {
		c.mu.Unlock()
		f.Close()
		return &fs.PathError{Op: "use", Path: cf.name, Err: fs.ErrClosed}
	}
	cf.f = f
	c.stats.Reopens++
	c.addDescriptorLocked()
	victims := c.evictLocked()
	c.mu.Unlock()
	closeVictims(victims)
	return nil
}

// release ends a use; ok reports whether the call succeeded.
func (cf *cachedFile) release(u use, ok bool) {
	c := cf.c
	c.mu.Lock()
	cf.users--
	switch u.access {
	case accessWrite:
		cf.writesInFlight--
	case accessSync:
		if !ok {
			cf.syncFailed = true
		}
		if ok && u.syncCleans && u.syncUpTo > cf.writesSynced {
			cf.writesSynced = u.syncUpTo
		}
	}
	c.idleIfEvictableLocked(cf)
	victims := c.evictLocked()
	c.mu.Unlock()
	closeVictims(victims)
}

func (cf *cachedFile) ReadAt(p []byte, off int64) (int, error) {
	u, err := cf.acquire(accessRead)
	if err != nil {
		return 0, err
	}
	n, err := u.f.ReadAt(p, off)
	cf.release(u, err == nil)
	return n, err
}

func (cf *cachedFile) WriteAt(p []byte, off int64) (int, error) {
	u, err := cf.acquire(accessWrite)
	if err != nil {
		return 0, err
	}
	n, err := u.f.WriteAt(p, off)
	cf.release(u, err == nil)
	return n, err
}

func (cf *cachedFile) Truncate(size int64) error {
	u, err := cf.acquire(accessWrite)
	if err != nil {
		return err
	}
	err = u.f.Truncate(size)
	cf.release(u, err == nil)
	return err
}

func (cf *cachedFile) Datasync() error {
	u, err := cf.acquire(accessSync)
	if err != nil {
		return err
	}
	err = u.f.Datasync()
	cf.release(u, err == nil)
	return err
}

func (cf *cachedFile) Size() (int64, error) {
	u, err := cf.acquire(accessRead)
	if err != nil {
		return 0, err
	}
	n, err := u.f.Size()
	cf.release(u, err == nil)
	return n, err
}

// Chmod sets the file's mode if the base's files can (WriteFileAtomic).
func (cf *cachedFile) Chmod(mode os.FileMode) error {
	u, err := cf.acquire(accessRead)
	if err != nil {
		return err
	}
	err = nil
	if ch, ok := u.f.(interface{ Chmod(os.FileMode) error }); ok {
		err = ch.Chmod(mode)
	}
	cf.release(u, err == nil)
	return err
}

func (cf *cachedFile) Name() string { return cf.name }

// Close closes the descriptor if one is held: its error is the base's.
func (cf *cachedFile) Close() error {
	c := cf.c
	c.mu.Lock()
	if cf.closed {
		c.mu.Unlock()
		return &fs.PathError{Op: "close", Path: cf.name, Err: fs.ErrClosed}
	}
	cf.closed = true
	c.unidleLocked(cf)
	c.unregisterLocked(cf)
	c.stats.Files--
	f := cf.f
	cf.f = nil
	if f != nil {
		c.stats.Descriptors--
	}
	c.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.Close()
}
