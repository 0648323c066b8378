package etcdlock

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock"
)

var _ driver.Inspector = (*Driver)(nil)

// queueKey matches the last segment of a queue key: a lease ID in hex, with
// the slot number dlock adds (concurrency.Mutex and etcdctl use the lease ID
// alone; dlock before slots added 16 random hex digits).
var queueKey = regexp.MustCompile(`^[0-9a-f]{1,16}(-[0-9a-f]{16})?$`)

// Inspect implements driver.Inspector: it reads every queue key under the
// driver's prefix whose lock name starts with prefix, in one range read. For
// each lock with a holder it reports the holder's owner (the key's value;
// "etcd-lease:<lease ID in hex>" for etcdctl lock and concurrency.Mutex
// holders, which store none), its token, the number of waiters,
// and ExpiresIn -1 (the lock lives as long as the holder's etcd lease).
// Count is the holder's hold count when this driver holds it, else 1.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	resp, err := d.cli.Get(ctx, d.prefix+prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcdlock: inspect: %w", err)
	}
	type queue struct {
		info driver.LockInfo
		rev  int64
		key  string
	}
	queues := map[string]*queue{}
	kinds := map[kindQueue][]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		k := strings.TrimPrefix(string(kv.Key), d.prefix)
		if j := strings.IndexByte(k, 0); j >= 0 {
			name := k[:j]
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			switch rest := k[j:]; {
			case strings.HasPrefix(rest, rwMark):
				kinds[kindQueue{name, driver.Write}] = append(kinds[kindQueue{name, driver.Write}], kv)
			case strings.HasPrefix(rest, semMark):
				kinds[kindQueue{name, driver.Permit}] = append(kinds[kindQueue{name, driver.Permit}], kv)
			}
			continue // a lock-delay guard, or a kind's queue key
		}
		i := strings.LastIndexByte(k, '/')
		if i < 0 || !queueKey.MatchString(k[i+1:]) {
			continue
		}
		name := k[:i]
		if !strings.HasPrefix(name, prefix) {
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
			if q.info.Owner == "" {
				// etcdctl lock and concurrency.Mutex store no value: name
				// the holder's etcd lease, so that the lock does not look
				// free.
				q.info.Owner = fmt.Sprintf("etcd-lease:%x", kv.Lease)
			}
		}
	}
	out := make([]driver.LockInfo, 0, len(queues))
	for _, q := range queues {
		q.info.Count = d.holds.Count(q.info.Name, q.info.Owner, func(h *handle) bool { return h.key == q.key })
		out = append(out, q.info)
	}
	for kq, kvs := range kinds {
		out = append(out, d.inspectKind(kq, kvs))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out, nil
}

// kindQueue is the queue of a read/write lock (kind Write) or a semaphore
// (kind Permit) of a name.
type kindQueue struct {
	name string
	kind driver.Kind
}

// inspectKind describes the read/write lock or semaphore whose queue keys
// are kvs: the readers granted (the keys older than the first writer key)
// or the writer, or the permits taken (the oldest keys, up to the size).
// Token is the newest holder's (a key's mod revision: the revision of its
// put, or of the write that marked a waited grant, see touch); Owner is a
// writer's, or the one holder's.
func (d *Driver) inspectKind(kq kindQueue, kvs []*mvccpb.KeyValue) driver.LockInfo {
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].CreateRevision < kvs[j].CreateRevision })
	base, _ := d.kindBase(kq.kind, kq.name)
	info := driver.LockInfo{Name: kq.name, Kind: kq.kind, ExpiresIn: -1}
	held := 0
	switch kq.kind {
	case driver.Write:
		for _, kv := range kvs {
			w := strings.HasPrefix(string(kv.Key), base+"w/")
			if w && held == 0 {
				held = 1
				info.Owner = string(kv.Value)
				info.Count = d.holds.Count(sessionlock.HoldName(driver.Write, kq.name), info.Owner, func(h *handle) bool { return h.key == string(kv.Key) })
				info.Token = uint64(kv.ModRevision)
				break
			}
			if w {
				break
			}
			held++
			info.Readers++
			info.Token = uint64(kv.ModRevision)
			info.Owner = string(kv.Value)
		}
		if info.Readers > 1 {
			info.Owner = ""
		}
		if info.Readers > 0 {
			info.Count = info.Readers
		}
	case driver.Permit:
		if n, _, ok := parseSemValue(kvs[0].Value); ok {
			info.Permits = n
		}
		for _, kv := range kvs {
			if held >= max(info.Permits, 1) {
				break
			}
			held++
			_, info.Owner, _ = parseSemValue(kv.Value)
			info.Token = uint64(kv.ModRevision)
		}
		info.Holders = held
		info.Count = held
		if held > 1 {
			info.Owner = ""
		}
	}
	info.Waiters = len(kvs) - held
	return info
}
