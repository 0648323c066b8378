package sqlitelock

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// lockable: wake-up signals are open-file-description byte locks.
const lockable = true

// ofd is an open of a companion shard file whose byte locks are Linux
// open-file-description locks.
type ofd struct{ f *os.File }

// openLocker opens the companion shard file at path, creating it with perm
// (the database file's permission bits) if it is missing and the directory
// lets it. write is needed for exclusive locks; without it the file is
// opened for reading (shared locks only), also where it cannot be created.
func openLocker(path string, write bool, perm os.FileMode) (fileLocker, error) {
	if write {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm)
		if err != nil {
			return nil, err
		}
		return ofd{f}, nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, perm)
	if err != nil {
		if f, err = os.Open(path); err != nil {
			return nil, err
		}
	}
	return ofd{f}, nil
}

func (o ofd) lk(off int64, typ int16) *unix.Flock_t {
	return &unix.Flock_t{Type: typ, Whence: 0, Start: off, Len: 1}
}

func (o ofd) try(off int64, exclusive, unlock bool) (bool, error) {
	typ := int16(unix.F_RDLCK)
	switch {
	case unlock:
		typ = unix.F_UNLCK
	case exclusive:
		typ = unix.F_WRLCK
	}
	err := unix.FcntlFlock(o.f.Fd(), unix.F_OFD_SETLK, o.lk(off, typ))
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return false, nil
	}
	return err == nil, err
}

func (o ofd) others(off int64) (bool, error) {
	lk := o.lk(off, unix.F_WRLCK)
	if err := unix.FcntlFlock(o.f.Fd(), unix.F_OFD_GETLK, lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

func (o ofd) wait(off int64) error {
	for {
		err := unix.FcntlFlock(o.f.Fd(), unix.F_OFD_SETLKW, o.lk(off, unix.F_RDLCK))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func (o ofd) close() error { return o.f.Close() }
