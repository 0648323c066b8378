package mysqllock

import (
	"sync"
	"time"
)

// Stand-back after a contended release (see standback.StandBack). The
// server gives a releaser no cheap sign that someone waits, so the sign is
// the driver's own: it was refused the name by the server lately, or has
// waiters of its own for it. The sign is dropped when a stand-back gave
// the lock to nobody (this driver's next grant has the token right after
// its previous one, so no one else was granted in between): a driver that
// only competed with itself stops standing back.

// contendedFor is how long a refusal by the server marks a name as
// contended.
const contendedFor = time.Second

// refusals records when the server last refused this driver each name: a
// sign that the name is contended, kept for contendedFor. All methods are
// safe for concurrent use.
type refusals struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newRefusals() *refusals { return &refusals{at: map[string]time.Time{}} }

// add records that the server refused this driver name now.
func (r *refusals) add(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.at) >= 4096 {
		clear(r.at)
	}
	r.at[name] = time.Now()
}

// recent reports whether the server refused this driver name within the
// last contendedFor.
func (r *refusals) recent(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[name]
	return ok && time.Since(at) < contendedFor
}

// forget drops name's record.
func (r *refusals) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.at, name)
}
