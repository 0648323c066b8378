package zklock

import (
	"encoding/binary"
	"testing"
	"time"
)

// TestSniffSplitFrames: the sniffer follows the server's frames however the
// reads split them: it learns the negotiated timeout from the connect
// response and the zxid and session of an announced create's reply, and
// ignores other replies.
func TestSniffSplitFrames(t *testing.T) {
	frame := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	connect := binary.BigEndian.AppendUint32(nil, 0)         // protocol version
	connect = binary.BigEndian.AppendUint32(connect, 1500)   // timeout (ms)
	connect = binary.BigEndian.AppendUint64(connect, 0x1234) // session ID
	connect = append(connect, 0, 0, 0, 16)                   // password length
	connect = append(connect, make([]byte, 16+1)...)         // password, read-only flag
	reply := func(xid int32, zxid int64, code int32, s string) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(xid))
		b = binary.BigEndian.AppendUint64(b, uint64(zxid))
		b = binary.BigEndian.AppendUint32(b, uint32(code))
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		return append(b, s...)
	}
	prefix := "/dlock/x/" + "0123456789abcdef0123456789abcdef" + nodeMarker
	other := "/dlock/x/" + "fedcba9876543210fedcba9876543210" + nodeMarker
	var stream []byte
	stream = append(stream, frame(connect)...)
	stream = append(stream, frame(reply(-2, 0, 0, ""))...)                    // a ping
	stream = append(stream, frame(reply(1, 7, -101, prefix+"0000000001"))...) // an error
	stream = append(stream, frame(reply(2, 8, 0, other+"0000000002"))...)     // not announced
	stream = append(stream, frame(reply(3, 9, 0, prefix+"0000000003"))...)
	for _, chunk := range []int{1, 3, 7, len(stream)} {
		tr := newTracker()
		tr.expect(prefix)
		tr.expect(other + "x") // another attempt's prefix
		s := &sniffConn{t: tr}
		for b := stream; len(b) > 0; {
			k := min(chunk, len(b))
			s.scan(b[:k])
			b = b[k:]
		}
		if d, ok := tr.timeout(0x1234); !ok || d != 1500*time.Millisecond {
			t.Fatalf("chunks of %d: timeout %v %v, want 1.5s", chunk, d, ok)
		}
		c, ok := tr.done(prefix, prefix+"0000000003")
		if !ok || c.zxid != 9 || c.session != 0x1234 {
			t.Fatalf("chunks of %d: create seen as %+v %v, want zxid 9 on session 0x1234", chunk, c, ok)
		}
		if _, ok := tr.done(other+"x", other+"0000000002"); ok {
			t.Fatalf("chunks of %d: a reply for another prefix was taken", chunk)
		}
	}
}

// TestSniffWritten: the channel of an announced create is closed when a
// create request for its prefix is written, and by nothing else.
func TestSniffWritten(t *testing.T) {
	req := func(op int32, path string) []byte {
		b := binary.BigEndian.AppendUint32(nil, 0) // length, filled below
		b = binary.BigEndian.AppendUint32(b, 5)    // xid
		b = binary.BigEndian.AppendUint32(b, uint32(op))
		b = binary.BigEndian.AppendUint32(b, uint32(len(path)))
		b = append(b, path...)
		b = append(b, 0, 0, 0, 0) // data, ACLs and flags follow in a real request
		binary.BigEndian.PutUint32(b, uint32(len(b)-4))
		return b
	}
	prefix := "/dlock/x/" + "0123456789abcdef0123456789abcdef" + nodeMarker
	tr := newTracker()
	written := tr.expect(prefix)
	closed := func() bool {
		select {
		case <-written:
			return true
		default:
			return false
		}
	}
	tr.sending(req(8, prefix))             // a listing of the same path
	tr.sending(req(opCreate, prefix+"x"))  // another path
	tr.sending(req(opCreate, "/dlock/x"))  // a parent
	tr.sending(req(opCreate, prefix)[:20]) // cut short
	if closed() {
		t.Fatal("closed by another request")
	}
	tr.sending(req(opCreate, prefix))
	if !closed() {
		t.Fatal("not closed by the create")
	}
	tr.sending(req(opCreate, prefix)) // a retry: no second close
	tr.done(prefix, "")
}
