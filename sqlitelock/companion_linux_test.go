package sqlitelock

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"golang.org/x/sys/unix"
)

// companionLocks counts, per companion file of the database at db (every
// regular file whose path starts with db+"-dlock", in a directory of that
// name too), the record locks /proc/locks lists on its inode.
func companionLocks(t *testing.T, db string) map[string]int {
	t.Helper()
	ids := map[string]string{} // "maj:min:ino" as /proc/locks prints it → path
	err := filepath.WalkDir(filepath.Dir(db), func(p string, e fs.DirEntry, err error) error {
		if err != nil || !strings.HasPrefix(p, db+"-dlock") || !e.Type().IsRegular() {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		ids[fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)] = p
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		t.Fatalf("the record locks of the companion files: %v", err)
	}
	defer f.Close()
	n := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: OFDLCK ADVISORY WRITE -1 fe:00:778394 5 5"; a blocked
		// request has "->" after the number.
		fields := strings.Fields(sc.Text())
		for _, fl := range fields {
			if p, ok := ids[fl]; ok && fields[1] != "->" {
				n[p]++
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHeldLocksSpreadOverCompanions: the byte locks of the leases one
// driver holds are spread over the companion's shard files, so that a Lock
// of another name touches a file with a few of them, not all (Linux walks a
// file's whole record-lock list on every fcntl: with 10,000 held on one file
// a Lock+Unlock cost 1.85× its cost with none, issue #13). Every held lease
// still keeps its byte.
func TestHeldLocksSpreadOverCompanions(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "locks.db")
	d, err := openPath(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const held = 640
	for i := range held {
		if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: fmt.Sprintf("held-%d", i), Owner: "o", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	n := companionLocks(t, db)
	total, most, where := 0, 0, ""
	for p, c := range n {
		total += c
		if c > most {
			most, where = c, p
		}
	}
	if total != held {
		t.Fatalf("%d byte locks on the companion files (%v), want one per held lease, %d", total, n, held)
	}
	if most > held/8 {
		t.Fatalf("%d of the %d held leases' byte locks are on one file, %s: a Lock of any name in it walks them all", most, held, where)
	}
	// One descriptor per shard file, however many names are held.
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	open := 0
	for _, e := range fds {
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(p, db+"-dlock") {
			open++
		}
	}
	if open > shards {
		t.Fatalf("%d descriptors open on the companion files for %d held leases, want at most %d", open, held, shards)
	}
}

// TestCompanionPermissions: the companion directory and its files take the
// database file's permission bits (the directory searchable where the file
// is readable), so every user that may use the database may signal.
func TestCompanionPermissions(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "locks.db")
	if err := os.WriteFile(db, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(db, 0o640); err != nil {
		t.Fatal(err)
	}
	d, err := openPath(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "a", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release(ctx, driver.Lease{Name: "a", Owner: "o", Token: g.Token})
	umask := os.FileMode(unix.Umask(0))
	unix.Umask(int(umask))
	for p, want := range map[string]os.FileMode{
		db + "-dlock.d": 0o750 &^ umask,
		filepath.Join(db+"-dlock.d", fmt.Sprint(shardOf(offset("a")))): 0o640 &^ umask,
	} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
}
