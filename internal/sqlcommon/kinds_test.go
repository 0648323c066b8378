package sqlcommon

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

func TestDecideKind(t *testing.T) {
	const now = int64(1_000_000_000)
	live := func(owner string, k int, fence int64) Holder {
		return Holder{Owner: owner, Kind: k, Count: 1, Fence: fence, LockUntil: now + 5e6, DelayUntil: now + 5e6}
	}
	delayed := func(owner string, k int) Holder { // expired, inside its lock-delay
		return Holder{Owner: owner, Kind: k, Count: 1, Fence: 3, LockUntil: now - 1, DelayUntil: now + 2e6}
	}
	dead := func(owner string, k int) Holder {
		return Holder{Owner: owner, Kind: k, Count: 1, Fence: 2, LockUntil: now - 2, DelayUntil: now - 1}
	}
	R, W, P, M := int(driver.Read), int(driver.Write), int(driver.Permit), KindMark
	req := func(owner string, k driver.Kind) driver.AcquireRequest {
		r := driver.AcquireRequest{Name: "n", Owner: owner, TTL: time.Second, Kind: k}
		if k == driver.Permit {
			r.Permits = 2
		}
		return r
	}
	waiting := req("w", driver.Write)
	waiting.Waiting = true
	cases := []struct {
		name    string
		hs      []Holder
		req     driver.AcquireRequest
		grant   bool
		token   uint64
		count   int
		mark    bool // a mark is Put
		deletes int
	}{
		{"read free", nil, req("a", driver.Read), true, 11, 1, false, 0},
		{"readers share", []Holder{live("b", R, 5)}, req("a", driver.Read), true, 11, 1, false, 0},
		{"writer excludes reader", []Holder{live("b", W, 5)}, req("a", driver.Read), false, 0, 0, false, 0},
		{"own writer excludes own read", []Holder{live("a", W, 5)}, req("a", driver.Read), false, 0, 0, false, 0},
		{"reader excludes writer", []Holder{live("b", R, 5)}, req("a", driver.Write), false, 0, 0, false, 0},
		{"upgrade refused", []Holder{live("a", R, 5)}, req("a", driver.Write), false, 0, 0, false, 0},
		{"writer excludes writer", []Holder{live("b", W, 5)}, req("a", driver.Write), false, 0, 0, false, 0},
		{"write re-entry", []Holder{live("a", W, 5)}, req("a", driver.Write), true, 5, 2, false, 0},
		{"read re-entry behind a mark", []Holder{live("a", R, 5), live("w", M, 0)}, req("a", driver.Read), true, 5, 2, false, 0},
		{"mark holds new readers back", []Holder{live("b", R, 5), live("w", M, 0)}, req("a", driver.Read), false, 0, 0, false, 0},
		{"own mark does not", []Holder{live("w", M, 0)}, req("w", driver.Read), true, 11, 1, false, 0},
		{"marks do not block writers", []Holder{live("x", M, 0)}, req("a", driver.Write), true, 11, 1, false, 0},
		{"waiting refusal leaves a mark", []Holder{live("b", R, 5)}, waiting, false, 0, 0, true, 0},
		{"grant deletes own mark", []Holder{live("w", M, 0)}, waiting, true, 11, 1, false, 1},
		{"lock-delay of a reader blocks writers", []Holder{delayed("b", R)}, req("a", driver.Write), false, 0, 0, false, 0},
		{"lock-delay of a reader lets readers in", []Holder{delayed("b", R)}, req("a", driver.Read), true, 11, 1, false, 0},
		{"own lapsed grant in its lock-delay", []Holder{delayed("a", R)}, req("a", driver.Read), false, 0, 0, false, 0},
		{"dead rows are deleted", []Holder{dead("b", W), dead("c", R)}, req("a", driver.Write), true, 11, 1, false, 2},
		{"permit free", []Holder{live("b", P, 5)}, req("a", driver.Permit), true, 11, 1, false, 0},
		{"permits full", []Holder{live("b", P, 5), live("c", P, 6)}, req("a", driver.Permit), false, 0, 0, false, 0},
		{"delayed permit counts", []Holder{live("b", P, 5), delayed("c", P)}, req("a", driver.Permit), false, 0, 0, false, 0},
		{"permit re-entry when full", []Holder{live("a", P, 5), live("c", P, 6)}, req("a", driver.Permit), true, 5, 2, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := KindState{Fence: 10, Permits: 2, Now: now}
			if c.req.Kind != driver.Permit {
				st.Permits = 0
			}
			p := DecideKind(st, c.hs, c.req)
			if p.Err != nil {
				t.Fatal(p.Err)
			}
			if p.Granted != c.grant {
				t.Fatalf("granted %v, want %v (plan %+v)", p.Granted, c.grant, p)
			}
			if c.grant && (p.Token != c.token || p.Count != c.count) {
				t.Fatalf("token %d count %d, want %d and %d", p.Token, p.Count, c.token, c.count)
			}
			if !c.grant {
				if p.Locked == nil {
					t.Fatal("a refusal without a LockedError")
				}
				if (p.Put != nil) != c.mark || (c.mark && p.Put.Kind != KindMark) {
					t.Fatalf("refusal writes %+v, want a mark: %v", p.Put, c.mark)
				}
				if p.SetState || len(p.Delete) > 0 {
					t.Fatalf("a refusal changes the state or deletes: %+v", p)
				}
			}
			if c.grant && c.count == 1 && (!p.SetState || p.Fence != int64(c.token)) {
				t.Fatalf("a new grant must store its token as the counter: %+v", p)
			}
			if len(p.Delete) != c.deletes {
				t.Fatalf("deletes %+v, want %d", p.Delete, c.deletes)
			}
		})
	}
}

func TestDecideKindPermits(t *testing.T) {
	const now = int64(1e9)
	st := KindState{Fence: 1, Permits: 2, Now: now}
	busy := []Holder{{Owner: "b", Kind: int(driver.Permit), Count: 1, Fence: 1, LockUntil: now + 1e6, DelayUntil: now + 1e6}}
	r := driver.AcquireRequest{Name: "s", Owner: "a", TTL: time.Second, Kind: driver.Permit, Permits: 3}
	if p := DecideKind(st, busy, r); !errors.Is(p.Err, driver.ErrInvalid) {
		t.Fatalf("a different count while in use: %+v, want ErrInvalid", p)
	}
	p := DecideKind(st, nil, r)
	if p.Err != nil || !p.Granted || p.Permits != 3 || !p.SetState {
		t.Fatalf("an idle semaphore resized: %+v", p)
	}
	r.Permits = 0
	if p := DecideKind(st, nil, r); !errors.Is(p.Err, driver.ErrInvalid) {
		t.Fatalf("0 permits: %+v, want ErrInvalid", p)
	}
}
