package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/sessionlock"
)

// Release implements driver.Driver. The last release deletes the holder's
// own node (its path is unique: GUID and sequence number), so it can never
// delete a newer holder's node.
//
// A Release whose outcome is unknown (an error other than ErrNotHeld: the
// connection was lost, or ctx ended, mid-request) may be called again with
// the same lease, as often as needed: a nested release counts the hold down
// only once its check has succeeded, and a last release deletes only that
// node, so a repeat returns 0 when it deleted it, or ErrNotHeld once the node
// is gone (deleted by an earlier attempt, by its session's end, or by
// someone else). It never touches another grant.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	hd, ok := l.Handle.(*handle)
	if !ok || hd == nil {
		return 0, fmt.Errorf("zklock: release: foreign handle %T: %w", l.Handle, driver.ErrNotHeld)
	}
	// A nested release is counted down locally once a check found the node
	// in place; a check whose outcome is unknown leaves the count alone, so
	// the caller may simply call Release again.
	n, nested, err := d.holds.Release(sessionlock.HoldName(hd.kind(), l.Name), l.Owner, hd, d.checker(ctx),
		func() error { return fmt.Errorf("zklock: node %s is gone: %w", hd.path, driver.ErrNotHeld) })
	if nested || err != nil {
		return n, err
	}
	_, err = do(ctx, func() (struct{}, error) { return struct{}{}, d.deleteHeld(hd) })
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return 0, fmt.Errorf("zklock: node %s is gone: %w", hd.path, driver.ErrNotHeld)
	case errors.Is(err, zk.ErrBadVersion):
		return 0, fmt.Errorf("zklock: node %s was changed by someone else: %w", hd.path, driver.ErrNotHeld)
	case err != nil:
		return 0, ctxerr.Wrap(ctx, "zklock: release", err)
	}
	return 0, nil
}
