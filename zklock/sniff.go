package zklock

// Reading the server's replies as they pass.
//
// go-zookeeper hides two things the driver needs: the session timeout the
// server negotiated (in the connect response), and the zxid of a create
// (every reply's header carries the zxid of the request's transaction, and a
// create's zxid is the new node's czxid, the lock's fencing token; go-
// zookeeper v1.0.4 has no create2 that would return the node's stat). On the
// connections the driver opens itself, every socket is a sniffConn that
// follows the server's frames as go-zookeeper reads them: it records the
// timeout of the connect response, and the zxid and session of the reply to
// a create that the driver announced (expect) by the random prefix of the
// node's name. The driver then needs no Exists to learn the czxid and the
// ephemeral owner of the node it created. A connection passed to New has no
// sniffer; the driver reads the node's stat instead.

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// created is what a create's reply showed: the path made, the zxid of its
// transaction (the node's czxid) and the session it came on (the node's
// ephemeral owner).
type created struct {
	path    string
	zxid    int64
	session int64
}

// creates are the lock node creates a connection's sniffers look out for.
// Its zero value is ready to use; it is safe for concurrent use.
type creates struct {
	waiting atomic.Int32 // len(want): sniffers look at reply bodies only when some create is announced
	cmu     sync.Mutex
	want    map[string]*expected // by the node name prefix
}

// expected is one announced create.
type expected struct {
	seen    *created      // what its reply showed; nil until the reply is seen
	written chan struct{} // closed when its request is written to the socket
	closed  bool          // written is closed
}

// expect announces a create of a node whose path starts with prefix (unique
// to one attempt). Call done(prefix) when the create has returned. The
// channel returned is closed when the create's request is written to the
// connection's socket (the first time, when it is retried): a request
// sent after that is served after the create.
func (c *creates) expect(prefix string) <-chan struct{} {
	e := &expected{written: make(chan struct{})}
	c.cmu.Lock()
	if c.want == nil {
		c.want = map[string]*expected{}
	}
	c.want[prefix] = e
	c.waiting.Store(int32(len(c.want)))
	c.cmu.Unlock()
	return e.written
}

// done forgets the create announced with prefix and returns what its reply
// showed, if a reply whose path is path was seen.
func (c *creates) done(prefix, path string) (created, bool) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	e := c.want[prefix]
	delete(c.want, prefix)
	c.waiting.Store(int32(len(c.want)))
	if e == nil || e.seen == nil || e.seen.path != path {
		return created{}, false
	}
	return *e.seen, true
}

// saw records a successful reply whose body starts with the string path,
// received on session at zxid, if it answers an announced create: a lock
// node's name is its prefix and a sequence number of 10 characters.
func (c *creates) saw(path string, zxid, session int64) {
	if len(path) <= seqLen {
		return
	}
	prefix := path[:len(path)-seqLen]
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if e, ok := c.want[prefix]; ok && e.seen == nil {
		e.seen = &created{path: path, zxid: zxid, session: session}
	}
}

// sending looks at a request about to be written, a whole frame as go-
// zookeeper writes them (length, xid, opcode, body): a create's body starts
// with the path asked for, which for a sequential node is the prefix that
// was announced.
func (c *creates) sending(b []byte) {
	if len(b) < 16 || int32(binary.BigEndian.Uint32(b[8:12])) != opCreate {
		return
	}
	n := int(int32(binary.BigEndian.Uint32(b[12:16])))
	if n <= 0 || 16+n > len(b) {
		return
	}
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if e, ok := c.want[string(b[16:16+n])]; ok && !e.closed {
		e.closed = true
		close(e.written)
	}
}

// opCreate is the opcode of ZooKeeper's create request.
const opCreate = 1

// seqLen is the length of the sequence number ZooKeeper appends to a
// sequential node's name (%010d).
const seqLen = 10

// maxSniff bounds the bytes of a reply body looked at: a header and a path.
const maxSniff = 16 + 4 + 4096

// sniffConn is one socket of a tracked connection. Only go-zookeeper's
// reading goroutine calls Read, so its fields need no lock.
type sniffConn struct {
	net.Conn
	t *tracker

	frames  int     // frames read completely
	lenBuf  [4]byte // the current frame's length, while it is read
	nLen    int     // bytes of lenBuf read
	left    int     // bytes of the current frame's body not yet read
	body    []byte  // the first bytes of the current frame's body
	session int64   // from the connect response
}

// Write tells the tracker about an announced create before its request
// goes out. Only go-zookeeper's sending goroutine writes, one whole request
// per call, so whatever is sent after Write returned follows it on the
// wire.
func (s *sniffConn) Write(p []byte) (int, error) {
	if s.t.waiting.Load() > 0 {
		s.t.sending(p)
	}
	return s.Conn.Write(p)
}

func (s *sniffConn) Read(p []byte) (int, error) {
	n, err := s.Conn.Read(p)
	s.scan(p[:n])
	return n, err
}

// scan follows the frames in b: a 4-byte big-endian length, then the body.
func (s *sniffConn) scan(b []byte) {
	for len(b) > 0 {
		if s.nLen < 4 {
			k := copy(s.lenBuf[s.nLen:], b)
			s.nLen += k
			b = b[k:]
			if s.nLen < 4 {
				return
			}
			s.left = int(int32(binary.BigEndian.Uint32(s.lenBuf[:])))
			if s.left <= 0 {
				s.left = 0
				s.endFrame()
			}
			continue
		}
		k := min(s.left, len(b))
		limit := 16 // the connect response's head, or a reply header
		if s.frames > 0 && s.t.waiting.Load() > 0 {
			limit = maxSniff
		}
		if room := limit - len(s.body); room > 0 {
			s.body = append(s.body, b[:min(k, room)]...)
		}
		s.left -= k
		b = b[k:]
		if s.left == 0 {
			s.endFrame()
		}
	}
}

// endFrame handles the frame whose body was just read.
func (s *sniffConn) endFrame() {
	body := s.body
	s.body, s.nLen = s.body[:0], 0
	s.frames++
	if s.frames == 1 {
		// The connect response: protocol version, timeout in ms, session ID.
		if len(body) < 16 {
			return
		}
		ms := int32(binary.BigEndian.Uint32(body[4:8]))
		id := int64(binary.BigEndian.Uint64(body[8:16]))
		s.session = id
		if id != 0 && ms > 0 {
			s.t.mu.Lock()
			s.t.timeouts[id] = time.Duration(ms) * time.Millisecond
			s.t.mu.Unlock()
		}
		return
	}
	// A reply: xid, zxid, error code, then the body (a create's: the path).
	if len(body) < 20 || binary.BigEndian.Uint32(body[12:16]) != 0 {
		return
	}
	n := int(int32(binary.BigEndian.Uint32(body[16:20])))
	if n <= 0 || 20+n > len(body) || body[20] != '/' {
		return
	}
	s.t.saw(string(body[20:20+n]), int64(binary.BigEndian.Uint64(body[4:12])), s.session)
}
