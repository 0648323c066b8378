package zklock

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// nodeMarker separates the GUID from the sequence number in a node's name
// in the kazoo layout; it is kazoo's Lock._NODE_NAME.
const nodeMarker = "__lock__"

// contender matches the lock nodes of a mutex's queue, whichever client made
// them: kazoo's <guid>__lock__<seq> (its contender pattern) and Curator's
// InterProcessMutex _c_<uuid>-lock-<seq> (or lock-<seq> unprotected). The
// sequence numbers of all sequential children of one node come from one
// counter, so the two namings order against each other by sequence number.
var contender = regexp.MustCompile(`(?:__lock__|lock-)(-?\d{10})$`)

// Layouts: the name a mutex request gives its node (see Options.Layout).
const (
	// LayoutKazoo names nodes <32 hex digits>__lock__<seq>, as Python
	// kazoo's Lock recipe: kazoo clients on the same path share the queue.
	LayoutKazoo = "kazoo"
	// LayoutCurator names nodes _c_<uuid>-lock-<seq>, as Apache Curator's
	// InterProcessMutex: Curator clients on the same path share the queue.
	LayoutCurator = "curator"
)

func checkRoot(root string) error {
	if root == "/" {
		return nil
	}
	if !strings.HasPrefix(root, "/") || strings.HasSuffix(root, "/") {
		return fmt.Errorf("zklock: root %q must start with '/' and not end with one", root)
	}
	if err := checkSegments(root[1:]); err != nil {
		return fmt.Errorf("zklock: root %q: %v", root, err)
	}
	return nil
}

func checkSegments(p string) error {
	for _, seg := range strings.Split(p, "/") {
		switch {
		case seg == "":
			return errors.New("zklock: empty path segment (leading, trailing or doubled '/')")
		case seg == "." || seg == "..":
			return fmt.Errorf("zklock: path segment %q is not allowed", seg)
		case contender.MatchString(seg):
			return fmt.Errorf("zklock: path segment %q looks like a lock node", seg)
		}
		for _, r := range seg {
			if !zkRune(r) {
				return fmt.Errorf("zklock: character %U is not allowed in ZooKeeper paths", r)
			}
		}
	}
	return nil
}

// parent is the node under which name's queue lives.
func (d *Driver) parent(name string) string {
	if d.root == "/" {
		return "/" + escapeName(name, true)
	}
	return d.root + "/" + escapeName(name, false)
}

// escapeName maps a lock name onto a relative ZooKeeper path. Names made of
// characters ZooKeeper accepts, with non-empty '/'-separated segments, map
// verbatim. Otherwise '%' and each byte of a character ZooKeeper refuses
// (control characters, characters outside the Basic Multilingual Plane,
// private-use and special characters) are written as %XX, as is a '/' that
// would make an empty segment, the dots of a "." or ".." segment, one '_' of
// a segment that looks like a lock node (the first character of its
// "__lock__" or "lock-" marker), the 'z' of "zookeeper" directly
// under "/", and the first 'd' of a segment named dlock-delay, dlock-rw or
// dlock-sem (the nodes of a lock's lock-delay guard, read/write lock and
// semaphore). Decoding the %XX escapes gives the name back, so two names never
// share a path.
func escapeName(name string, atRoot bool) string {
	var b strings.Builder
	esc := func(s string) {
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, "%%%02X", s[i])
		}
	}
	segs := strings.Split(name, "/")
	for i, seg := range segs {
		if i > 0 {
			// Keep the '/' only between two non-empty segments.
			if segs[i-1] != "" && seg != "" {
				b.WriteByte('/')
			} else {
				esc("/")
			}
		}
		if seg == "." || seg == ".." {
			esc(seg)
			continue
		}
		if (i == 0 && atRoot && seg == "zookeeper") || seg == guardName || seg == rwNode || seg == semNode {
			esc(seg[:1])
			seg = seg[1:]
		}
		cut := -1
		if m := contender.FindStringIndex(seg); m != nil {
			cut = m[0] // the first character of "__lock__" or "lock-"
		}
		for j, r := range seg {
			switch {
			case j == cut || r == '%' || !zkRune(r):
				esc(string(r))
			default:
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}

// zkRune reports whether ZooKeeper accepts r in a path. ZooKeeper checks
// UTF-16 code units, so characters outside the BMP (surrogate pairs) are
// refused too.
func zkRune(r rune) bool {
	return r != utf8.RuneError && r > 0x1f && (r < 0x7f || r > 0x9f) && (r < 0xd800 || r > 0xf8ff) && r < 0xfff0
}

// newPrefix returns a fresh protected node name prefix of a mutex request in
// the driver's layout: ZooKeeper appends the sequence number.
func (d *Driver) newPrefix() string {
	if d.layout == LayoutCurator {
		return protectedPrefix(newUUID(), lockMark)
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("zklock: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:]) + nodeMarker
}

// queue returns the lock nodes among children, in queue order.
func queue(children []string) []string {
	type entry struct {
		name string
		seq  int64
	}
	var es []entry
	for _, c := range children {
		m := contender.FindStringSubmatch(c)
		if m == nil {
			continue
		}
		seq, _ := strconv.ParseInt(m[1], 10, 64)
		es = append(es, entry{c, seq})
	}
	slices.SortFunc(es, func(a, b entry) int {
		if a.seq != b.seq {
			return int(a.seq - b.seq)
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.name
	}
	return out
}
