package redlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
)

func kindEnv(t *testing.T) (*Driver, []*redis.Client, context.Context) {
	t.Helper()
	_, admins, open := safetyEnv(t)
	ctx := ctxT(t, 30*time.Second)
	d, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.(*Driver), admins, ctx
}

func rwReq(name, owner string, k driver.Kind) driver.AcquireRequest {
	return driver.AcquireRequest{Name: name, Owner: owner, TTL: 30 * time.Second, Kind: k}
}

// plantKind grants req on one node only, as a partial or leftover grant.
func plantKind(t *testing.T, ctx context.Context, a *redis.Client, req driver.AcquireRequest) redisscript.KindResult {
	t.Helper()
	r, err := redisscript.AcquireKind(ctx, a, redisscript.KindKeysFor(DefaultKeyPrefix, req.Name, req.Kind), req, 0)
	if err != nil || !r.Granted {
		t.Fatalf("plant %s by %s: %+v, %v", req.Kind, req.Owner, r, err)
	}
	return r
}

// TestRWQuorumExclusion: a reader or a writer needs a quorum of nodes, and
// on a node shared by two quorums the scripts never let a reader and a
// writer hold at once: readers holding two of three nodes keep every
// writer out even though one node is free, and a writer holding two nodes
// keeps readers out.
func TestRWQuorumExclusion(t *testing.T) {
	d, admins, ctx := kindEnv(t)
	const name = "rwq"
	r := rwReq(name, "reader", driver.Read)
	plantKind(t, ctx, admins[0], r)
	plantKind(t, ctx, admins[1], r)
	w := rwReq(name, "w", driver.Write)
	if _, err := d.TryAcquire(ctx, w); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("writer while a reader holds 2 of 3 nodes: %v, want ErrLocked", err)
	}
	// The refused writer's partial grant (node 2) was undone.
	kk := redisscript.KindKeysFor(DefaultKeyPrefix, name, driver.Write)
	if n := admins[2].Exists(ctx, kk.Writer).Val(); n != 0 {
		t.Fatal("the refused writer's grant on node 2 was left behind")
	}
	// Another reader shares.
	g, err := d.TryAcquire(ctx, rwReq(name, "r2", driver.Read))
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "r2", Token: g.Token, Handle: g.Handle, Kind: driver.Read}); err != nil {
		t.Fatal(err)
	}
	for _, a := range admins[:2] {
		if _, _, err := redisscript.ReleaseKind(ctx, a, redisscript.KindKeysFor(DefaultKeyPrefix, name, driver.Read), "reader", 0); err != nil {
			t.Fatal(err)
		}
	}
	// A writer on two nodes keeps readers out.
	plantKind(t, ctx, admins[1], w)
	plantKind(t, ctx, admins[2], w)
	if _, err := d.TryAcquire(ctx, rwReq(name, "r3", driver.Read)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("reader while a writer holds 2 of 3 nodes: %v, want ErrLocked", err)
	}
	if _, err := d.TryAcquire(ctx, rwReq(name, "w2", driver.Write)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("second writer: %v, want ErrLocked", err)
	}
}

// TestRWTokensAcrossNodes: the nodes' read/write counters differ; a grant's
// token is the largest among its quorum and is written back to a quorum
// (into the counter and the holder's own place), so a later grant of either
// side on another quorum gets a larger token, and a re-entry on every node
// finds one token (a live re-entry, which keeps it).
func TestRWTokensAcrossNodes(t *testing.T) {
	d, admins, ctx := kindEnv(t)
	const name = "rwtok"
	kk := redisscript.KindKeysFor(DefaultKeyPrefix, name, driver.Write)
	rk := redisscript.KindKeysFor(DefaultKeyPrefix, name, driver.Read)
	// Node 1 is held by another writer: the reader's quorum is nodes 0, 2.
	plantKind(t, ctx, admins[1], rwReq(name, "other", driver.Write))
	// Token 40 was granted and fenced on nodes 0 and 1.
	for i, v := range []string{"40", "40", "1"} {
		admins[i].Set(ctx, kk.Fence, v, 0)
	}
	r := rwReq(name, "r", driver.Read)
	g, err := d.TryAcquire(ctx, r)
	if err != nil || g.Token != 41 {
		t.Fatalf("reader over counters 40,40,1 on nodes 0 and 2: %+v, %v; want token 41", g, err)
	}
	have := 0
	for _, a := range admins {
		if n, _ := a.Get(ctx, kk.Fence).Int(); n >= 41 {
			have++
		}
	}
	if have < 2 {
		t.Fatalf("token 41 reached %d nodes' counters when the grant returned, want a quorum", have)
	}
	testwait.Until(t, 10*time.Second, "the token written into node 2's reader place", func() bool {
		v, err := admins[2].HGet(ctx, rk.Values, "r").Result()
		return err == nil && strings.HasPrefix(v, "1\n41\n")
	})
	g2, err := d.TryAcquire(ctx, r)
	if err != nil || g2.Token != g.Token || g2.Count != 2 {
		t.Fatalf("reader re-entry: %+v, %v; want token %d count 2 (the token written into every node's place)", g2, err, g.Token)
	}
	for range 2 {
		if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "r", Handle: g.Handle, Kind: driver.Read}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := redisscript.ReleaseKind(ctx, admins[1], kk, "other", 0); err != nil {
		t.Fatal(err)
	}
	// Node 0 is held by someone else's writer: a writer's quorum is nodes
	// 1 and 2, whose counters the reader's write-back raised.
	plantKind(t, ctx, admins[0], rwReq(name, "other", driver.Write))
	gw, err := d.TryAcquire(ctx, rwReq(name, "w", driver.Write))
	if err != nil || gw.Token <= g.Token {
		t.Fatalf("writer on nodes 1 and 2 after the reader's token %d: %+v, %v", g.Token, gw, err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "w", Handle: gw.Handle, Kind: driver.Write}); err != nil {
		t.Fatal(err)
	}
	// And the other way round: the writer's token was written back, so a
	// reader on nodes 1 and 2 gets a larger one.
	gr, err := d.TryAcquire(ctx, rwReq(name, "r2", driver.Read))
	if err != nil || gr.Token <= gw.Token {
		t.Fatalf("reader on nodes 1 and 2 after the writer's token %d: %+v, %v", gw.Token, gr, err)
	}
}

// TestRWLeftoverReadGetsAFreshToken: redlock's leftover rule holds for
// reads: an owner's read place left on one node by a failed attempt is not
// re-entered into an old token; the owner's next read gets a token above
// every earlier grant's.
func TestRWLeftoverReadGetsAFreshToken(t *testing.T) {
	d, admins, ctx := kindEnv(t)
	// The acquire returns on the first two answers unless one is a
	// re-entry; repeat so that node 0 (the leftover's) is among them.
	for i := range 6 {
		leftoverRead(t, ctx, d, admins, fmt.Sprintf("rwleft-%d", i))
	}
}

func leftoverRead(t *testing.T, ctx context.Context, d *Driver, admins []*redis.Client, name string) {
	t.Helper()
	kk := redisscript.KindKeysFor(DefaultKeyPrefix, name, driver.Read)
	// Token 5 was granted and fenced on nodes 0 and 1 before; node 0 keeps
	// a leftover read place of owner O with token 1.
	admins[0].Set(ctx, kk.Fence, "0", 0)
	plantKind(t, ctx, admins[0], rwReq(name, "O", driver.Read))
	for i, v := range []string{"5", "5", "1"} {
		admins[i].Set(ctx, kk.Fence, v, 0)
	}
	g, err := d.TryAcquire(ctx, rwReq(name, "O", driver.Read))
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= 5 || g.Count != 1 {
		t.Fatalf("read by the leftover's owner: token %d count %d; want a fresh grant above token 5", g.Token, g.Count)
	}
}

// TestWaitingWriterMarkedOnEveryNode: a refused waiting writer is marked on
// every node, those that granted it before the undo included, and Withdraw
// removes the marks everywhere. Semaphores are refused.
func TestWaitingWriterMarkedOnEveryNode(t *testing.T) {
	d, admins, ctx := kindEnv(t)
	const name = "rwmark"
	r := rwReq(name, "reader", driver.Read)
	plantKind(t, ctx, admins[1], r)
	plantKind(t, ctx, admins[2], r)
	w := rwReq(name, "w", driver.Write)
	w.Waiting = true
	if _, err := d.TryAcquire(ctx, w); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiting writer: %v, want ErrLocked", err)
	}
	kk := redisscript.KindKeysFor(DefaultKeyPrefix, name, driver.Write)
	for i, a := range admins {
		if err := a.ZScore(ctx, kk.Marks, "w").Err(); err != nil {
			t.Fatalf("node %d: no waiting writer mark: %v", i, err)
		}
	}
	if _, err := d.TryAcquire(ctx, rwReq(name, "r2", driver.Read)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("new reader past the marks: %v, want ErrLocked", err)
	}
	infos, err := d.Inspect(ctx, name)
	if err != nil || len(infos) != 1 {
		t.Fatalf("Inspect: %+v, %v", infos, err)
	}
	if in := infos[0]; in.Kind != driver.Write || in.Readers != 1 || in.Waiters != 1 || in.Owner != "" || in.ExpiresIn < 20*time.Second {
		t.Fatalf("Inspect: %+v, want a read/write lock with 1 reader on a quorum and 1 waiting writer", in)
	}
	if err := d.Withdraw(ctx, w); err != nil {
		t.Fatal(err)
	}
	for i, a := range admins {
		if n := a.Exists(ctx, kk.Marks).Val(); n != 0 {
			t.Fatalf("node %d: mark left after Withdraw", i)
		}
	}
	if _, err := d.TryAcquire(ctx, rwReq(name, "r2", driver.Read)); err != nil {
		t.Fatalf("new reader after Withdraw: %v", err)
	}
	if d.SupportsKind(driver.Permit) {
		t.Fatal("SupportsKind(Permit) = true")
	}
	p := rwReq(name, "p", driver.Permit)
	p.Permits = 2
	if _, err := d.TryAcquire(ctx, p); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("permit: %v, want ErrUnsupported", err)
	}
}

// TestRaiseFence: RaiseFence raises a kind's counter on every node (a
// quorum must answer), so the next grant's token exceeds the value.
func TestRaiseFence(t *testing.T) {
	d, admins, ctx := kindEnv(t)
	if err := d.RaiseFence(ctx, "raise", driver.Write, 70); err != nil {
		t.Fatal(err)
	}
	if err := d.RaiseFence(ctx, "raise", driver.Exclusive, 30); err != nil {
		t.Fatal(err)
	}
	for i, a := range admins {
		if v := a.Get(ctx, redisscript.FenceKey(DefaultKeyPrefix, "raise", driver.Read)).Val(); v != "70" {
			t.Fatalf("node %d: rw counter %q, want 70", i, v)
		}
	}
	g, err := d.TryAcquire(ctx, rwReq("raise", "r", driver.Read))
	if err != nil || g.Token != 71 {
		t.Fatalf("read after raising to 70: %+v, %v; want token 71", g, err)
	}
	g, err = d.TryAcquire(ctx, rwReq("raise", "m", driver.Exclusive))
	if err != nil || g.Token != 31 {
		t.Fatalf("mutex after raising to 30: %+v, %v; want token 31", g, err)
	}
	if err := d.RaiseFence(ctx, "raise", driver.Permit, 1); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("permit: %v, want ErrUnsupported", err)
	}
}
