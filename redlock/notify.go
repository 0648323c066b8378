package redlock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/redisscript"
)

// Subscribe registers for release notifications of name on every node,
// over each node's single shared pub/sub connection (see redislock's
// Subscribe). A release publishes its token on every node; the first copy
// to arrive wakes one waiter of this driver, the others are dropped. It
// fails only if no node can be subscribed.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	ch := redisscript.KeysFor(d.prefix, name).Channel
	sig := make(chan struct{}, 1)
	var subs []*redisscript.Sub
	var firstErr error
	for i, n := range d.nodes {
		sub, err := n.hub.Subscribe(ctx, ch, sig)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", i, err)
			}
			continue
		}
		subs = append(subs, sub)
	}
	if len(subs) == 0 {
		return nil, ctxerr.Wrap(ctx, "redlock: subscribe", firstErr)
	}
	return redisscript.NewSubscription(sig, subs...), nil
}

// dedupeWindow is how long a release message counts as a copy of one
// received from another node with the same channel and token.
const dedupeWindow = time.Second

// dedupe lets one release, published on every node, wake the driver's
// waiters once: it passes the first message per channel and token. A
// message naming the first queued waiter ("token\nowner") passes from its
// quorum-th copy on instead: by then a quorum of nodes is free, so the
// waiter's attempt does not race the release on the others.
type dedupe struct {
	mu     sync.Mutex
	last   map[string]seenMsg
	quorum int // copies of a message naming a waiter that wake it (0: 1)
}

type seenMsg struct {
	payload string
	at      time.Time
	copies  int
}

func (dd *dedupe) first(channel, payload string) bool {
	now := time.Now()
	dd.mu.Lock()
	defer dd.mu.Unlock()
	targeted := strings.IndexByte(payload, '\n') >= 0
	if targeted {
		// Copies of other messages on the channel may come in between.
		channel += "\x00" + payload
	}
	if s, ok := dd.last[channel]; ok && s.payload == payload && now.Sub(s.at) < dedupeWindow {
		if !targeted {
			return false
		}
		s.copies++
		dd.last[channel] = s
		return s.copies >= dd.quorum
	}
	if dd.last == nil {
		dd.last = map[string]seenMsg{}
	}
	if len(dd.last) >= 4096 {
		for ch, s := range dd.last {
			if now.Sub(s.at) >= dedupeWindow {
				delete(dd.last, ch)
			}
		}
	}
	dd.last[channel] = seenMsg{payload: payload, at: now, copies: 1}
	return !targeted || dd.quorum <= 1
}
