//go:build !linux

package sqlitelock

import (
	"errors"
	"os"
)

// lockable: wake-up signals need Linux open-file-description locks;
// elsewhere waiters poll.
const lockable = false

// openLocker: wake-up signals need Linux open-file-description locks;
// elsewhere waiters poll.
func openLocker(string, bool, os.FileMode) (fileLocker, error) {
	return nil, errors.New("sqlitelock: wake-up signals need Linux")
}
