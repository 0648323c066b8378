package etcdlock

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock"
)

var _ driver.Inspector = (*Driver)(nil)

// queueKey matches the last segment of a queue key: a lease ID in hex, with
// the slot number in hex dlock adds (concurrency.Mutex and etcdctl use the
// lease ID alone; dlock before slots added 16 random hex digits, and wrote
// the slot number with 16 digits until it was shortened to save memory).
var queueKey = regexp.MustCompile(`^[0-9a-f]{1,16}(-[0-9a-f]{1,16})?$`)

// Inspect implements driver.Inspector: it reads every queue key under the
// driver's prefix whose lock name starts with prefix, in one range read. For
// each lock with a holder it reports the holder's owner (the key's value;
// "etcd-lease:<lease ID in hex>" for etcdctl lock and concurrency.Mutex
// holders, which store none), its token, the number of waiters,
// and ExpiresIn -1 (the lock lives as long as the holder's etcd lease).
// Count is the holder's hold count when this driver holds it, else 1.
//
// A lock kept only by the lock-delay guard of a holder that went without a
// release (see delay.go) is listed as not takeable: Owner LockDelayOwner,
// Count 0, Token 0, ExpiresIn the remaining TTL of the guard's lease (whole
// seconds, as etcd reports it; the lock is takeable once it has run out),
// and Waiters the requests queued behind it. The same holds for a
// read/write lock or a semaphore with no live holder but a lost holder's
// guard; a semaphore counts such guards in Holders (permits taken).
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
	guards := map[string]*mvccpb.KeyValue{}          // mutex guards by name
	kindGuards := map[kindQueue][]*mvccpb.KeyValue{} // kinds' guards
	present := make(map[string]bool, len(resp.Kvs))  // every key read
	for _, kv := range resp.Kvs {
		present[string(kv.Key)] = true
	}
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
			case rest == "\x00delay":
				guards[name] = kv
			case strings.HasPrefix(rest, rwDelayMark):
				kindGuards[kindQueue{name, driver.Write}] = append(kindGuards[kindQueue{name, driver.Write}], kv)
			case strings.HasPrefix(rest, semDelayMark):
				kindGuards[kindQueue{name, driver.Permit}] = append(kindGuards[kindQueue{name, driver.Permit}], kv)
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
	for name, g := range guards {
		q := queues[name]
		if q != nil && !blocked([]*mvccpb.KeyValue{g}, q.key) {
			continue // the guard of the live holder
		}
		if q == nil {
			q = &queue{info: driver.LockInfo{Name: name}}
			queues[name] = q
		}
		// The head of the queue (if any) waits for the guard.
		q.info.Owner, q.info.Token, q.key = LockDelayOwner, 0, ""
		q.info.ExpiresIn, err = d.guardTTL(ctx, g)
		if err != nil {
			return nil, err
		}
	}
	for _, q := range queues {
		if q.info.Owner != LockDelayOwner {
			q.info.Count = d.holds.Count(q.info.Name, q.info.Owner, func(h *handle) bool { return h.key == q.key })
		}
		out = append(out, q.info)
	}
	for kq, gs := range kindGuards {
		if _, ok := kinds[kq]; !ok {
			kinds[kq] = nil
		}
		// Keep only lost holders' guards.
		lost := gs[:0]
		for _, g := range gs {
			if !present[string(g.Value)] {
				lost = append(lost, g)
			}
		}
		kindGuards[kq] = lost
	}
	for kq, kvs := range kinds {
		info, err := d.inspectKind(ctx, kq, kvs, kindGuards[kq])
		if err != nil {
			return nil, err
		}
		if info.Owner == "" && info.Count == 0 && info.Waiters == 0 && info.Holders == 0 {
			continue // only live holders' guards, their keys gone meanwhile
		}
		out = append(out, info)
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
// writer's, or the one holder's. lost are the guards of holders whose keys
// are gone (see decide): they keep out a writer (and a reader, for a
// writer's guard), and take a permit each.
func (d *Driver) inspectKind(ctx context.Context, kq kindQueue, kvs, lost []*mvccpb.KeyValue) (driver.LockInfo, error) {
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].CreateRevision < kvs[j].CreateRevision })
	base, guards := d.kindBase(kq.kind, kq.name)
	info := driver.LockInfo{Name: kq.name, Kind: kq.kind, ExpiresIn: -1}
	lostW := false
	for _, g := range lost {
		if strings.HasPrefix(string(g.Key), guards+"w/") {
			lostW = true
		}
	}
	held := 0
	switch kq.kind {
	case driver.Write:
		for _, kv := range kvs {
			w := strings.HasPrefix(string(kv.Key), base+"w/")
			if w && held == 0 && len(lost) > 0 || !w && lostW {
				break // waits for a lost holder's guard
			}
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
		if len(kvs) > 0 {
			if n, _, ok := parseSemValue(kvs[0].Value); ok {
				info.Permits = n
			}
		}
		for _, kv := range kvs {
			if held+len(lost) >= max(info.Permits, 1) {
				break
			}
			held++
			_, info.Owner, _ = parseSemValue(kv.Value)
			info.Token = uint64(kv.ModRevision)
		}
		info.Holders = held + len(lost)
		info.Count = held
		if held > 1 || len(lost) > 0 {
			info.Owner = ""
		}
	}
	info.Waiters = len(kvs) - held
	if held == 0 && len(lost) > 0 {
		// Kept by lost holders' guards: a writer (or the next permit)
		// waits for the first guard to go (a semaphore) or the last (a
		// read/write lock).
		info.Owner, info.Token = LockDelayOwner, 0
		for i, g := range lost {
			ttl, err := d.guardTTL(ctx, g)
			if err != nil {
				return info, err
			}
			if i == 0 || kq.kind == driver.Permit && ttl < info.ExpiresIn || kq.kind != driver.Permit && ttl > info.ExpiresIn {
				info.ExpiresIn = ttl
			}
		}
	}
	return info, nil
}

// LockDelayOwner is the Owner that Inspect reports for a lock kept only by
// the lock-delay guard of a holder that went without a release.
const LockDelayOwner = "lock-delay"

// guardTTL is the remaining TTL of guard g's lease, 0 when it has run out
// (the guard goes any moment).
func (d *Driver) guardTTL(ctx context.Context, g *mvccpb.KeyValue) (time.Duration, error) {
	resp, err := d.cli.TimeToLive(ctx, clientv3.LeaseID(g.Lease))
	if err != nil {
		return 0, fmt.Errorf("etcdlock: inspect: lock-delay guard's lease: %w", err)
	}
	return time.Duration(max(resp.TTL, 0)) * time.Second, nil
}
