package etcdlock

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
)

var _ driver.Inspector = (*Driver)(nil)

// queueKey matches the last segment of a queue key: a lease ID in hex, with
// the slot number dlock adds (concurrency.Mutex and etcdctl use the lease ID
// alone; dlock before slots added 16 random hex digits).
var queueKey = regexp.MustCompile(`^[0-9a-f]{1,16}(-[0-9a-f]{16})?$`)

// Inspect implements driver.Inspector: it reads every queue key under the
// driver's prefix whose lock name starts with prefix, in one range read. For
// each lock with a holder it reports the holder's owner (the key's value;
// empty for concurrency.Mutex holders), its token, the number of waiters,
// and ExpiresIn -1 (the lock lives as long as the holder's etcd lease).
// Count is the holder's hold count when this driver holds it, else 1.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	resp, err := d.cli.Get(ctx, d.prefix+escapeName(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcdlock: inspect: %w", err)
	}
	type queue struct {
		info driver.LockInfo
		rev  int64
		key  string
	}
	queues := map[string]*queue{}
	for _, kv := range resp.Kvs {
		k := strings.TrimPrefix(string(kv.Key), d.prefix)
		i := strings.LastIndexByte(k, '/')
		if i < 0 || !queueKey.MatchString(k[i+1:]) {
			continue
		}
		name, ok := unescapeName(k[:i])
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		q := queues[name]
		if q == nil {
			q = &queue{info: driver.LockInfo{Name: name, ExpiresIn: -1, Waiters: -1}}
			queues[name] = q
		}
		q.info.Waiters++
		if q.rev == 0 || kv.CreateRevision < q.rev {
			q.rev, q.key = kv.CreateRevision, string(kv.Key)
			q.info.Owner, q.info.Token = string(kv.Value), uint64(kv.CreateRevision)
		}
	}
	out := make([]driver.LockInfo, 0, len(queues))
	for _, q := range queues {
		q.info.Count = d.holds.Count(q.info.Name, q.info.Owner, func(h *handle) bool { return h.key == q.key })
		out = append(out, q.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// unescapeName reverses escapeName; ok is false for a key segment that
// escapeName cannot have produced.
func unescapeName(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, !strings.Contains(s, "/")
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return "", false
			}
			b.WriteByte(byte(v))
			i += 2
		case '/':
			return "", false
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), true
}
