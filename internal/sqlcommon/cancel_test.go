package sqlcommon

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCancelOnDone: a statement whose context never ends runs as it is; one
// whose context ends is cancelled through the backend's cancel (the
// statement's own context staying live), or, when that cancel fails, by
// cancelling the statement's context; either way the error wraps ctx's.
func TestCancelOnDone(t *testing.T) {
	boom := errors.New("statement failed")
	cancels := 0
	noCancel := func(context.Context) error { cancels++; return nil }
	if err := CancelOnDone(context.Background(), noCancel, func(context.Context) error { return boom }); err != boom || cancels != 0 {
		t.Fatalf("a statement whose context never ends: %v after %d cancels, want its own error and none", err, cancels)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	stop := make(chan struct{})
	serverCancel := func(context.Context) error { close(stop); return nil }
	err := CancelOnDone(ctx, serverCancel, func(qctx context.Context) error {
		select {
		case <-stop:
			if qctx.Err() != nil {
				return errors.New("the statement's context was cancelled before the server's cancel ended it")
			}
			return boom
		case <-time.After(5 * time.Second):
			return errors.New("not cancelled")
		}
	})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, boom) {
		t.Fatalf("a statement the server's cancel ended: %v, want ctx's error wrapping the statement's", err)
	}

	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	failing := func(context.Context) error { return errors.New("cannot reach the server") }
	err = CancelOnDone(ctx2, failing, func(qctx context.Context) error {
		select {
		case <-qctx.Done():
			return qctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("not cancelled")
		}
	})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a statement whose cancel failed: %v, want ctx's error wrapping the statement context's cancellation", err)
	}
}

// TestCancelOnDoneLetsCancelFinish: when the statement answers on its own
// while its cancel is on the way (MySQL: GET_LOCK's wait ran out as the
// caller's context ended), the cancel still runs to its end before
// CancelOnDone returns. It used to be cut short with the statement's
// context: the client gave up on the KILL QUERY it had sent, the server ran
// it later anyway, and it killed whatever the pooled connection ran next,
// a later Lock with a live context ("Error 1317 (70100): Query execution
// was interrupted", without the deadline, in mysqllock's
// TestCancelAsWaitEnds under load).
func TestCancelOnDoneLetsCancelFinish(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	var stmtCtx context.Context
	cutShort := make(chan bool, 1)
	backendCancel := func(kctx context.Context) error {
		<-returned       // the statement has answered on its own
		<-stmtCtx.Done() // and CancelOnDone has ended its context
		cutShort <- kctx.Err() != nil
		return nil
	}
	err := CancelOnDone(ctx, backendCancel, func(qctx context.Context) error {
		stmtCtx = qctx
		cancel() // the caller's context ends as the statement answers
		defer close(returned)
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("CancelOnDone = %v, want the caller's context's error", err)
	}
	select {
	case c := <-cutShort:
		if c {
			t.Fatal("the backend's cancel had its context cancelled when the statement answered")
		}
	default:
		t.Fatal("CancelOnDone returned before the backend's cancel finished")
	}
}
