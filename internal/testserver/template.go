package testserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Initialising a database directory is the slow part of starting PostgreSQL
// (initdb, ~2s) and MariaDB (mariadb-install-db, ~4s). It is done once per
// program version into a template kept under the user's cache directory
// ($DLOCK_TEST_CACHE, else e.g. ~/.cache/dlock-testserver), and each server
// (and each wiped restart) starts from a copy. Set DLOCK_TEST_CACHE=off to
// initialise every server from scratch.

var templateMu sync.Mutex

// cachedTemplate returns a directory holding an initialised data directory
// for key, building it with build (which must create the directory it is
// given) when it is not cached. When caching is off or impossible it returns
// "" and nil, and the caller initialises in place.
func cachedTemplate(key string, build func(dataDir string) error) (string, error) {
	root := os.Getenv("DLOCK_TEST_CACHE")
	switch root {
	case "off":
		return "", nil
	case "":
		c, err := os.UserCacheDir()
		if err != nil {
			return "", nil
		}
		root = filepath.Join(c, "dlock-testserver")
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", nil
	}
	final := filepath.Join(root, key)
	templateMu.Lock() // one build per process; other processes race through the rename
	defer templateMu.Unlock()
	if st, err := os.Stat(final); err == nil && st.IsDir() {
		return final, nil
	}
	work, err := os.MkdirTemp(baseDir(), "dlock-template-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	if err := build(filepath.Join(work, "data")); err != nil {
		return "", err
	}
	staging, err := os.MkdirTemp(root, "."+key+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(staging)
	if err := copyTree(filepath.Join(work, "data"), filepath.Join(staging, "data")); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(staging, "data"), final); err != nil {
		if st, err2 := os.Stat(final); err2 == nil && st.IsDir() {
			return final, nil // another process got there first
		}
		return "", fmt.Errorf("cache template: %w", err)
	}
	return final, nil
}

// copyTree copies src to dst (which must not exist) keeping modes.
func copyTree(src, dst string) error {
	out, err := exec.Command("cp", "-a", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp -a %s %s: %v: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// binaryKey identifies a program's build for template keys.
func binaryKey(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%d-%d", st.Size(), st.ModTime().Unix())
}
