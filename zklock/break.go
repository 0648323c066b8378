package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
)

var _ driver.Breaker = (*Driver)(nil)

// Break implements driver.Breaker: it deletes the node at the head of
// name's queue if its czxid (a mutex grant's token) is token. Sequential
// node names are never reused, so deleting that path can only remove that
// grant. The holder's session is told by its watch on the node.
func (d *Driver) Break(ctx context.Context, name string, token uint64) error {
	l, err := d.anyLink(ctx)
	if err != nil {
		return fmt.Errorf("zklock: break: %w", err)
	}
	conn := l.conn
	parent := d.parent(name)
	children, err := do(ctx, func() ([]string, error) {
		c, _, err := conn.Children(parent)
		return c, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("zklock: break %q: not held: %w", name, driver.ErrNotHeld)
	}
	if err != nil {
		return fmt.Errorf("zklock: break: %w", err)
	}
	for _, head := range queue(children) {
		path := parent + "/" + head
		st, err := do(ctx, func() (*zk.Stat, error) {
			_, st, err := conn.Exists(path)
			return st, err
		})
		if err != nil {
			return fmt.Errorf("zklock: break: %w", err)
		}
		if st == nil {
			continue // released meanwhile: the next one holds
		}
		if uint64(st.Czxid) != token {
			return fmt.Errorf("zklock: break %q: held with token %d, not %d: %w", name, st.Czxid, token, driver.ErrNotHeld)
		}
		_, err = do(ctx, func() (struct{}, error) { return struct{}{}, conn.Delete(path, -1) })
		if errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("zklock: break %q: the grant with token %d ended meanwhile: %w", name, token, driver.ErrNotHeld)
		}
		if err != nil {
			return fmt.Errorf("zklock: break: %w", err)
		}
		return nil
	}
	return fmt.Errorf("zklock: break %q: not held: %w", name, driver.ErrNotHeld)
}
